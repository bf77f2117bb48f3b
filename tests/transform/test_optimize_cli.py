"""`onnxaccel optimize` as a user meets it: the input is never lost, a failed gate exits 1 and still writes
the report, every bad argument gets a message and a hint (never a traceback)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_refuses_to_overwrite_the_input_unless_forced(invoke, mlp_path, tmp_path):
    model = tmp_path / "model.onnx"
    shutil.copyfile(mlp_path, model)
    before = _digest(model)
    result = invoke("optimize", model, "-o", model, "-t", "cpu")
    assert result.exit_code == 2 and "is the input model" in result.output and "--force" in result.output
    assert _digest(model) == before
    forced = invoke("optimize", model, "-o", model, "-t", "cpu", "--force", "--no-compile-cache")
    assert forced.exit_code == 0, forced.output


def test_existing_outputs_are_kept_unless_forced(invoke, mlp_path, tmp_path):
    foreign = tmp_path / "theirs.onnx"
    shutil.copyfile(mlp_path, foreign)
    result = invoke("optimize", mlp_path, "-o", foreign, "-t", "cpu")
    assert result.exit_code == 2 and "was not written by onnxaccel optimize" in result.output
    ours = tmp_path / "ours.onnx"
    assert invoke("optimize", mlp_path, "-o", ours, "-t", "cpu", "--no-compile-cache").exit_code == 0
    again = invoke("optimize", mlp_path, "-o", ours, "-t", "cpu", "--no-compile-cache")
    assert again.exit_code == 2 and "already exists" in again.output and "--force" in again.output
    forced = invoke("optimize", mlp_path, "-o", ours, "-t", "cpu", "--no-compile-cache", "--force")
    assert forced.exit_code == 0, forced.output


def test_a_failed_gate_exits_1_and_still_writes_the_report(invoke, overflow_path, tmp_path):
    report_path = tmp_path / "reports" / "fp16.json"
    result = invoke("optimize", overflow_path, "-o", tmp_path / "o.onnx", "-t", "cpu", "--shape", "batch=4",
                    "--fp16", "--max-error", "1e-3", "--no-compile-cache", "--report", report_path)
    assert result.exit_code == 1
    assert "accuracy gate FAILED" in result.output
    report = json.loads(report_path.read_text())
    assert report["passed"] is False
    failed = {c["name"] for c in report["accuracy"]["checks"] if not c["passed"]}
    assert {"max_error", "elementwise"} <= failed


def test_json_report_has_nodes_by_op_size_precision_and_accuracy(invoke, mlp_path, tmp_path):
    result = invoke("optimize", mlp_path, "-o", tmp_path / "o.onnx", "-t", "cpu", "--fp16", "--no-compile-cache",
                    "--json")
    report = json.loads(result.stdout)
    assert report["schema"] == "onnxaccel.optimize/1"
    assert report["before"]["ops"] == {"MatMul": 2, "Relu": 1, "Softmax": 1}
    assert {"size_bytes", "nodes", "precision", "weights_bytes_by_type"} <= set(report["after"])
    assert report["op_changes"] and all({"op", "before", "after", "delta"} <= set(c) for c in report["op_changes"])
    assert report["accuracy"]["status"] == "measured" and report["run_with"] == "cpu"


def test_rich_output_shows_the_tables(invoke, mlp_path, tmp_path):
    output = invoke("optimize", mlp_path, "-o", tmp_path / "o.onnx", "-t", "cpu", "--no-compile-cache").output
    for heading in ("model", "steps", "accuracy vs the original", "run it with"):
        assert heading in output


@pytest.mark.parametrize("args,code,message", [
    (["missing.onnx", "-o", "{tmp}/o.onnx"], 1, "Model file not found"),
    (["{mlp}", "-o", "{tmp}"], 2, "is a directory"),
    (["{mlp}", "-o", "{tmp}/o.txt"], 2, "does not end in .onnx"),
    (["{mlp}", "-o", "{tmp}/o.onnx", "--int8", "static"], 2, "needs calibration data"),
    (["{mlp}", "-o", "{tmp}/o.onnx", "--int8", "weird"], 2, "Unknown INT8 mode"),
    (["{mlp}", "-o", "{tmp}/o.onnx", "--fp16", "--int8", "dynamic"], 2, "exclude each other"),
    (["{mlp}", "-o", "{tmp}/o.onnx", "--graph-level", "max"], 2, "Unknown graph optimization level"),
    (["{mlp}", "-o", "{tmp}/o.onnx", "--min-topk-agreement", "5"], 2, "is a fraction"),
    (["{mlp}", "-o", "{tmp}/o.onnx", "--shape", "nope=3"], 2, "neither an input nor a symbolic dimension"),
    (["{mlp}", "-o", "{tmp}/o.onnx", "--opset", "3"], 2, "outside what the installed onnx converts"),
    (["{mlp}", "-o", "{tmp}/o.onnx", "--keep-fp32", "ghost", "--fp16"], 1, "does not have: ghost"),
    (["{mlp}", "-o", "{tmp}/o.onnx", "--report", "{tmp}/r.txt"], 2, "should end in .json"),
    (["{mlp}", "-o", "{tmp}/o.onnx", "-t", "gpu"], 2, "Unknown target device"),
])
def test_bad_input_gets_a_message_and_a_hint(invoke, mlp_path, tmp_path, args, code, message):
    args = [a.format(tmp=tmp_path, mlp=mlp_path) for a in args]
    if "-t" not in args:
        args += ["-t", "cpu"]
    result = invoke("optimize", *args)
    assert result.exit_code == code, result.output
    assert message in result.output.replace("\n", " ") and "hint:" in result.output
