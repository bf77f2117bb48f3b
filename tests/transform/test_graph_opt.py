"""Graph optimization levels, transformer fusions, onnxslim, fixed shapes and opset conversion: each changes
the graph the way it claims and the accuracy gate confirms the outputs did not change."""

from __future__ import annotations

import json

import onnx
import pytest

from onnxaccel.target import parse_target
from onnxaccel.transform.graph import choose_level, is_transformer
from onnxaccel.transform.shapes import symbolic_dims


def _optimize(invoke, model, out, *args):
    result = invoke("optimize", model, "-o", out, "-t", "cpu", "--no-compile-cache", "--eval-samples", "2",
                    "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("level", ["basic", "extended", "all"])
def test_ort_levels_shrink_the_detector_and_keep_its_outputs(invoke, pretrained_det, tmp_path, level):
    report = _optimize(invoke, pretrained_det, tmp_path / f"det.{level}.onnx", "--shape", "x=1x3x64x64",
                       "--graph-level", level)
    assert report["passed"] and report["after"]["nodes"] < report["before"]["nodes"]
    assert report["steps"][-1]["detail"]["level"] == level
    fused = {op for op in report["after"]["ops"] if op.startswith("com.microsoft.")}
    assert (not fused) if level == "basic" else fused  # basic stays standard ONNX; extended adds contrib ops
    # BatchNormalization folds into Conv
    assert report["after"]["ops"].get("BatchNormalization", 0) < report["before"]["ops"]["BatchNormalization"]


def test_levels_are_capped_where_offline_optimization_would_not_be_valid():
    assert choose_level("auto", parse_target("cpu"))[0] == "extended"
    level, provider, notes = choose_level("all", parse_target("migraphx"))
    assert (level, provider) == ("basic", "CPUExecutionProvider") and "compiled nodes" in notes[0]
    level, _, notes = choose_level("extended", parse_target("cuda"))  # no CUDA provider on this machine
    assert level == "basic" and "does not load here" in notes[0]


def test_transformer_fusions_on_bert_tiny(invoke, tmp_path):
    report = _optimize(invoke, "zoo:bert-tiny", tmp_path / "bert.opt.onnx")
    fusion = next(s for s in report["steps"] if s["name"] == "transformer-fusions")
    assert fusion["detail"]["fused"]["Attention"] == 2  # bert-tiny has 2 layers
    assert report["after"]["ops"]["com.microsoft.Attention"] == 2 and "Softmax" not in report["after"]["ops"]
    assert report["passed"]  # fp32 default tolerances: atol 1e-4, rtol 1e-3
    assert any("looks like a transformer" in n for n in report["notes"])


def test_not_a_transformer(pretrained_cls):
    assert not is_transformer(onnx.load(str(pretrained_cls)))


def test_fix_shape_opset_and_simplify(invoke, mlp_path, pretrained_cls, tmp_path):
    report = _optimize(invoke, mlp_path, tmp_path / "mlp.fixed.onnx", "--shape", "batch=8", "--fix-shape",
                       "--graph-level", "none")
    assert report["after"]["inputs"] == {"x": [8, 4]}
    assert symbolic_dims(onnx.load(str(tmp_path / "mlp.fixed.onnx"))) == []

    report = _optimize(invoke, pretrained_cls, tmp_path / "cls.slim.onnx", "--shape", "x=1x3x48x192",
                       "--opset", "13", "--simplify", "--graph-level", "none")
    assert [s["name"] for s in report["steps"]] == ["opset", "simplify"]
    assert report["after"]["opset"] == 13 and report["passed"]
    assert report["after"]["ops"].get("Constant", 0) < report["before"]["ops"]["Constant"]  # folded by onnxslim
