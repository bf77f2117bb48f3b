"""The precision label says what the session computed in: FP16 on the CPU provider runs most nodes in FP32
(ONNX Runtime inserts casts), and `run`, `bench` and the plan every command prints say so.

Model: the pretrained PP-OCR direction classifier (rapidocr-onnxruntime), a CNN.
"""

from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from onnxaccel.pipeline import prepare
from onnxaccel.target import parse_target

pytest.importorskip("onnxruntime")
SHAPE = {"x": (1, 3, 48, 192)}


def _cli(*args):
    from onnxaccel.cli.main import app

    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert "Traceback" not in result.output, result.output
    return result


def test_fp16_on_the_cpu_is_labelled_with_the_precision_that_executed(pretrained_cls):
    prepared = prepare(str(pretrained_cls), parse_target("cpu/fp16"), shapes=SHAPE)
    try:
        executed = prepared.plan.precision_executed
        assert executed["method"] == "profiling" and executed["nodes"]["fp32"] > executed["nodes"].get("fp16", 0)
        choice = prepared.plan.choice("precision")
        assert choice.value == executed["label"] != "fp16" and choice.value.endswith("fp32 elsewhere")
        assert f"of {executed['total']} nodes" in choice.value and choice.overrides
        assert prepared.plan.to_dict()["precision_executed"] == executed
    finally:
        prepared.close()


def test_fp32_keeps_its_label_without_profiling(pretrained_cls):
    prepared = prepare(str(pretrained_cls), parse_target("cpu"), shapes=SHAPE)
    try:
        assert prepared.plan.precision_executed is None and prepared.plan.choice("precision").value == "fp32"
    finally:
        prepared.close()


def test_run_and_bench_show_the_executed_precision(pretrained_cls, tmp_path):
    run = _cli("run", pretrained_cls, "-t", "cpu/fp16", "--shape", "x=1x3x48x192", "--json")
    assert run.exit_code == 0, run.output
    label = json.loads(run.stdout)["plan"]["precision_executed"]["label"]
    assert label.startswith("fp16 on ") and label.endswith("fp32 elsewhere")
    report = tmp_path / "bench.csv"
    bench = _cli("bench", pretrained_cls, "-t", "cpu/fp16", "--shape", "x=1x3x48x192", "--runs", "3", "--warmup",
                 "1", "--report", report)
    assert bench.exit_code == 0, bench.output
    rows = list(csv.DictReader(io.StringIO(report.read_text())))
    assert rows[0]["precision"] == "fp16" and rows[0]["precision_executed"] == label


def test_the_profiled_label_is_kept_while_the_converted_model_is_unchanged(pretrained_cls, monkeypatch):
    """The profiled session runs once per converted file: a second start reads the label the first one found."""
    first = prepare(str(pretrained_cls), parse_target("cpu/fp16"), shapes=SHAPE)
    first.close()
    import onnxaccel.precision.executed as executed_module

    def no_second_profile(*_args, **_kwargs):
        raise AssertionError("profiled again although the converted model is unchanged")

    monkeypatch.setattr(executed_module, "executed_precision", no_second_profile)
    second = prepare(str(pretrained_cls), parse_target("cpu/fp16"), shapes=SHAPE)
    try:
        assert second.plan.precision_executed == first.plan.precision_executed
    finally:
        second.close()
