"""Output comparison: the metrics on arrays, and real runs through two targets or precisions."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from onnxaccel import parse_target
from onnxaccel.analysis.compare import compare_targets
from onnxaccel.cli.compare import resolve_pair
from onnxaccel.cli.main import app
from onnxaccel.compare import compare_array, compare_outputs, default_tolerances
from onnxaccel.errors import UsageError


def _flat(text: str) -> str:
    return " ".join(text.split())  # Rich wraps at the test terminal's 80 columns


# -- metrics on arrays -------------------------------------------------------------------------------------

def test_identical_outputs_pass_with_zero_error():
    x = np.random.default_rng(0).standard_normal((2, 10)).astype(np.float32)
    result = compare_outputs({"y": x}, {"y": x.copy()}, atol=0, rtol=0)
    o = result.outputs[0]
    assert result.passed and o.max_abs == 0 and o.rel_l2 == 0 and o.cosine == pytest.approx(1.0)
    assert o.topk.top1 == 1.0 and o.topk.topk_overlap == 1.0


def test_tolerance_is_atol_plus_rtol_times_reference():
    ref = np.array([1.0, 100.0, 0.0], np.float32)
    cand = np.array([1.05, 104.0, 0.009], np.float32)
    assert compare_array("y", ref, cand, atol=0.01, rtol=0.05).passed
    tight = compare_array("y", ref, cand, atol=0.01, rtol=0.03)
    # 1.05 vs 1 needs 0.05 <= 0.01 + 0.03 and 104 vs 100 needs 4 <= 0.01 + 3: both fail; 0.009 vs 0 passes.
    assert not tight.passed and tight.mismatched == 2
    assert tight.required_atol == pytest.approx(1.0)  # max(|d| - rtol * |ref|) = 4 - 3
    # required_atol: the smallest atol that passes at this rtol.
    assert compare_array("y", ref, cand, atol=tight.required_atol, rtol=0.03).passed
    assert not compare_array("y", ref, cand, atol=tight.required_atol * 0.9, rtol=0.03).passed
    assert tight.max_abs == pytest.approx(4.0) and tight.max_rel == pytest.approx(0.05, rel=1e-3)


def test_nan_and_inf_match_only_themselves():
    ref = np.array([np.nan, np.inf, 1.0], np.float32)
    assert compare_array("y", ref, ref.copy(), atol=0, rtol=0).passed
    new_inf = compare_array("y", np.array([1.0, 2.0], np.float32), np.array([1.0, np.inf], np.float32),
                            atol=1, rtol=1)
    assert not new_inf.passed and new_inf.inf == (0, 1) and "appear only in the candidate" in new_inf.reason
    flipped = compare_array("y", np.array([np.inf]), np.array([-np.inf]), atol=1, rtol=1)
    assert not flipped.passed


def test_shape_mismatch_and_missing_outputs_fail():
    result = compare_outputs({"a": np.zeros((2, 3)), "b": np.zeros(2)}, {"a": np.zeros((3, 2)), "c": np.zeros(2)},
                             atol=1, rtol=1)
    assert not result.passed and result.missing == ("b", "c")
    assert "shapes differ" in result.outputs[0].reason


def test_topk_agreement_of_classifier_rows():
    ref = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]], np.float32)
    cand = np.array([[0.1, 0.2, 0.7], [0.5, 0.3, 0.2]], np.float32)  # row 0: classes 1 and 2 swap
    o = compare_array("probs", ref, cand, atol=0, rtol=0, topk=2)
    assert o.topk.top1 == 0.5 and o.topk.topk_overlap == 1.0 and o.topk.k == 2
    # [N, C, 1, 1] is classifier-like too; a feature map is not.
    assert compare_array("p", ref[:, :, None, None], cand[:, :, None, None], atol=0, rtol=0).topk.top1 == 0.5
    assert compare_array("map", np.zeros((1, 1, 8, 8)), np.zeros((1, 1, 8, 8)), atol=0, rtol=0).topk is None


def test_bad_tolerances_are_usage_errors():
    with pytest.raises(UsageError):
        compare_outputs({}, {}, atol=-1, rtol=0)
    with pytest.raises(UsageError):
        compare_outputs({}, {}, atol=0, rtol=float("nan"))


def test_default_tolerances_follow_the_lowest_precision():
    assert default_tolerances(parse_target("cpu"), parse_target("cpu")) == (1e-4, 1e-3)
    assert default_tolerances(parse_target("cpu"), parse_target("cpu/fp16")) == (1e-2, 5e-2)


# -- real runs -------------------------------------------------------------------------------------------

def test_fp32_against_fp32_passes_at_fp32_tolerances():
    comparison = compare_targets("zoo:bert-tiny", parse_target("cpu"),
                                 parse_target("cpu?graph_optimization_level=disable"), atol=1e-4, rtol=1e-3)
    assert comparison.result.passed, comparison.result.to_dict()
    assert {o.name for o in comparison.result.outputs} == {"last_hidden_state", "pooler_output"}
    assert all(o.cosine > 0.999999 for o in comparison.result.outputs)
    assert comparison.to_dict()["schema"] == "onnxaccel.compare/1"


def test_harmless_fp16_passes_on_a_pretrained_classifier(pretrained_cls):
    comparison = compare_targets(str(pretrained_cls), parse_target("cpu"), parse_target("cpu/fp16"),
                                 atol=1e-2, rtol=5e-2, shapes={"x": (4, 3, 48, 192)})
    o = comparison.result.outputs[0]
    assert comparison.result.passed
    assert o.topk.top1 == 1.0  # same predicted direction for every image
    assert 0 < o.max_abs < 5e-3 and o.rel_l2 < 1e-2  # FP16 changed the numbers, within honest bounds
    assert any("InsertCast" in n or "insert_cast" in n for n in comparison.notes)


def test_fp16_that_cannot_hold_a_constant_fails(clamped_path):
    comparison = compare_targets(str(clamped_path), parse_target("cpu"), parse_target("cpu/fp16"), atol=1e-2,
                                 rtol=5e-2)
    o = comparison.result.outputs[0]
    assert not comparison.result.passed and o.rel_l2 > 0.3 and o.cosine < 0.9


# -- the command line ------------------------------------------------------------------------------------

def test_cli_exit_status_reflects_the_verdict(mlp_path, clamped_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["compare", str(mlp_path), "-t", "cpu", "-t", "cpu?graph_optimization_level=basic",
                             "--json"])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.output)
    assert data["passed"] and data["divergence"] is None and data["schema"] == "onnxaccel.compare/1"
    bad = runner.invoke(app, ["compare", str(clamped_path), "-t", "cpu", "-p", "fp16"])
    assert bad.exit_code == 1
    assert "FAIL" in bad.output and "--bisect" in _flat(bad.output)


def test_cli_bisect_names_the_node(clamped_path):
    result = CliRunner().invoke(app, ["compare", str(clamped_path), "-t", "cpu", "-p", "fp16", "--bisect"])
    assert result.exit_code == 1
    text = _flat(result.output)
    assert "First divergence at node 'scale_up' (Mul)" in text and "'k_1e5' holds values up to 1e+05" in text


def test_cli_rejects_bad_arguments_with_hints(mlp_path):
    runner = CliRunner()
    unknown = runner.invoke(app, ["compare", str(mlp_path), "-t", "cpu", "-t", "cdua"])
    assert unknown.exit_code == 2 and "Did you mean 'cuda'" in _flat(unknown.output)
    same = runner.invoke(app, ["compare", str(mlp_path), "-t", "cpu", "-t", "cpu"])
    assert same.exit_code == 2 and "nothing to compare" in _flat(same.output)
    negative = runner.invoke(app, ["compare", str(mlp_path), "-t", "cpu", "-p", "fp16", "--atol", "-1"])
    assert negative.exit_code == 2 and "--atol must be" in _flat(negative.output)
    none = runner.invoke(app, ["compare", str(mlp_path)])
    assert none.exit_code == 2 and "needs --target" in _flat(none.output)
    precision = runner.invoke(app, ["compare", str(mlp_path), "-t", "cpu", "-p", "fp8"])
    assert precision.exit_code == 2 and "Unknown precision" in _flat(precision.output)


def test_pair_resolution():
    assert [str(t) for t in resolve_pair(["cpu"], ["fp16"], None)] == ["cpu", "cpu/fp16"]
    assert [str(t) for t in resolve_pair(["cpu"], ["fp16", "fp32"], None)] == ["cpu/fp16", "cpu"]
    assert [str(t) for t in resolve_pair(["cuda"], [], None)] == ["cpu", "cuda"]
    cand = resolve_pair(["cpu", "cuda"], ["fp16"], ["prefer_nhwc=1"])
    assert [str(t) for t in cand] == ["cpu/fp16", "cuda/fp16?prefer_nhwc=1"]  # options go to the candidate
    with pytest.raises(UsageError):
        resolve_pair(["cpu"], [], None)  # cpu against cpu
    with pytest.raises(UsageError):
        resolve_pair(["cpu", "cuda", "migraphx"], [], None)
