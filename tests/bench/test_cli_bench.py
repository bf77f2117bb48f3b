"""`onnxaccel bench` on the command line: sweeps, JSON, and a clear message with a hint for every bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from onnxaccel.cli.main import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_sweep_json_has_one_cell_per_combination(mlp_path):
    result = invoke("bench", str(mlp_path), "-t", "cpu", "-p", "fp32,int8", "-b", "1", "-b", "3",
                    "--iobinding", "both", "--concurrency", "1,2", "--runs", "10", "--warmup", "2", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["schema"] == "onnxaccel.bench/2" and report["summary"] == {"cells": 16, "ok": 16, "failed": 0,
                                                                             "skipped": 0}
    ids = {c["id"] for c in report["cells"]}
    assert "cpu/int8|batch=3|io=off|c=2" in ids and "cpu|batch=1|io=on|c=1" in ids
    assert report["settings"]["runs"] == 10 and report["settings"]["accuracy_gate"]["max_error"] is None


def test_table_output_for_people(mlp_path):
    result = invoke("bench", str(mlp_path), "-t", "cpu", "-t", "cuda", "--runs", "10", "--warmup", "2")
    assert result.exit_code == 0  # one target failed, the other ran
    assert "items/s" in result.stdout and "FAILED" in result.stdout
    assert "CUDAExecutionProvider is not part of the installed" in result.stderr and "hint:" in result.stderr


def test_every_cell_failing_exits_1_with_the_first_error(mlp_path):
    result = invoke("bench", str(mlp_path), "-t", "cuda", "--runs", "5")
    assert result.exit_code == 1
    assert "every cell failed" in result.stderr and "hint:" in result.stderr


@pytest.mark.parametrize("args,code,message", [
    (["--iobinding", "sometimes"], 2, "--iobinding takes on, off or both"),
    (["--graph", "yes"], 2, "--graph takes on, off or both"),
    (["--batch", "0"], 2, "--batch takes positive integers"),
    (["--batch", "1,x"], 2, "--batch takes positive integers"),
    (["--concurrency", "0"], 2, "--concurrency takes positive integers"),
    (["--runs", "10", "--duration", "1"], 2, "--runs and --duration exclude each other"),
    (["--runs", "0"], 2, "--runs must be at least 1"),
    (["--duration", "-1"], 2, "--duration must be positive"),
    (["--report", "out.txt"], 2, "unknown file type '.txt'"),
    (["--resume"], 2, "--resume needs the JSON report"),
    (["--baseline", "/no/such.json"], 1, "Report file not found"),
    (["-p", "fp64"], 2, "Unknown precision 'fp64'"),
    (["-t", "cpu?prefer_nhwc=1"], 2, "is not an option of CPUExecutionProvider"),
    (["--max-error", "-1"], 2, "--max-error must be a finite number >= 0"),
    (["--config", "/no/such.json"], 2, "Configuration file not found"),
])
def test_bad_input_gets_a_message_and_a_hint(mlp_path, args, code, message):
    result = invoke("bench", str(mlp_path), "-t", "cpu", *args)
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert message in " ".join(result.stderr.split()) and "hint:" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_no_model_and_no_config():
    result = invoke("bench")
    assert result.exit_code == 2 and "No model given" in result.stderr
