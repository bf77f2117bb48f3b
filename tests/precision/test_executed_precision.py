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


def test_batch_shows_the_executed_precision(pretrained_cls, tmp_path):
    # batch's workers build their sessions in pipelines or Ray actors; the job labels what they computed in.
    import numpy as np

    data = tmp_path / "rows"
    data.mkdir()
    np.save(data / "part.npy", np.random.default_rng(0).random((3, 3, 48, 192), dtype=np.float32))
    result = _cli("batch", pretrained_cls, "-i", data, "-o", tmp_path / "out", "-t", "cpu/fp16", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    label = report["plan"]["precision_executed"]["label"]
    assert label.startswith("fp16 on ") and label.endswith("fp32 elsewhere")
    assert report["plan"]["choices"][1] == {"name": "precision", "value": label, "overrides": True,
                                            "reason": report["plan"]["choices"][1]["reason"]}
    assert any(w.startswith(f"precision as executed: {label}") for w in report["warnings"])
    text = _cli("batch", pretrained_cls, "-i", data, "-o", tmp_path / "out2", "-t", "cpu/fp16")
    assert f"precision as executed: {label}" in " ".join(text.output.split())


def test_serve_says_the_precision_each_model_executed_in(pretrained_cls, tmp_path):
    # A real server (the CLI, loopback): its ready line carries the model's executed precision as a warning.
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "onnxaccel.cli.main", "serve", str(pretrained_cls), "-t",
                             "cpu/fp16", "--shape", "x=1x3x48x192", "--http-port", "0", "--grpc-port", "0", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "ONNXACCEL_CACHE_DIR": str(tmp_path / "cache")})
    from concurrent.futures import ThreadPoolExecutor

    reader = ThreadPoolExecutor(1)  # a server that never gets ready fails the test, never hangs it
    try:
        line = reader.submit(proc.stdout.readline).result(timeout=180)
        assert line, proc.stderr.read()
        ready = json.loads(line)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.shutdown(wait=False)
    assert ready["event"] == "ready" and ready["models"][0]["state"] == "READY"
    (warning,) = [w for w in ready["warnings"] if "precision as executed" in w]
    assert warning.startswith(f"{ready['models'][0]['name']}: precision as executed: fp16 on ")
    assert "fp32 elsewhere" in warning
    # The start-up span of the session names the converted model's precision, not the 'fp32' it is compiled at.
    (session,) = [s for s in ready["startup"]["stages"] if s["stage"] == "session"]
    assert session["detail"] == "cpu/fp16 model b1"
