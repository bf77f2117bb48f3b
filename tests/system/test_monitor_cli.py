"""`onnxaccel monitor`: exit 1 without GPUs; JSON lines and the live view from real rocm-smi output."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from onnxaccel.cli.main import app
from onnxaccel.cli.monitor import SCHEMA
from tests.system.tool_outputs import rocm_smi_note

runner = CliRunner()


def test_without_any_gpu_monitor_exits_1_and_says_why_for_each_backend(clean_env):
    result = runner.invoke(app, ["monitor", "--count", "1"])
    said = " ".join(result.output.split())  # Rich wraps at 80 columns
    assert result.exit_code == 1 and "Traceback" not in said
    assert "No GPU to monitor" in said and "no NVIDIA driver" in said
    assert rocm_smi_note() in said and "onnxaccel doctor" in said


def test_json_mode_prints_one_line_per_reading_of_real_rocm_smi_output(tools):
    tools("rocm-smi", "rocm_smi_7900xtx.json")
    result = runner.invoke(app, ["monitor", "--json", "--count", "3", "--interval", "0.05"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 3 and all(line["schema"] == SCHEMA for line in lines)
    assert [line["t"] for line in lines] == sorted(line["t"] for line in lines)
    [gpu] = lines[-1]["gpus"]
    assert (gpu["vendor"], gpu["power_w"], gpu["temperature_c"], gpu["memory_total_bytes"]) == \
        ("amd", 19.0, 49.0, 25753026560)


def test_live_view_runs_count_readings_then_prints_the_summary(tools):
    tools("rocm-smi", "rocm_smi_7900xtx.json", "rocm_smi_7900xtx.json", "rocm_smi_legacy_lowercase.json")
    result = runner.invoke(app, ["monitor", "--count", "2", "--interval", "0.05"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "Summary: 2 readings" in said
    assert "120.5/222.0 W" in said  # mean and peak of 19 W then 222 W
    assert "GPUs (rocm-smi)" in said and "222.0 W" in said  # the live table (its last state when not a terminal)


def test_zero_interval_and_zero_count_are_usage_errors(clean_env):
    for args in (["--interval", "0"], ["--count", "0"]):
        result = runner.invoke(app, ["monitor", *args])
        assert result.exit_code == 2 and "Traceback" not in result.output
