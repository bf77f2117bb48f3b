"""The GPU sampler: empty but valid without GPUs; real rocm-smi output read through the subprocess path."""

from __future__ import annotations

import json
import time

import pytest

from onnxaccel.errors import UsageError
from onnxaccel.system.telemetry import SCHEMA, GpuSampler
from onnxaccel.system.telemetry_backends import BackendUnavailable, RocmSmiBackend
from tests.system.tool_outputs import rocm_smi_note, write_tool


def _run(sampler: GpuSampler, seconds: float):
    sampler.start()
    time.sleep(seconds)
    return sampler.stop()


def test_sampler_on_a_machine_without_gpus_returns_an_empty_valid_summary(clean_env):
    summary = _run(GpuSampler(interval=0.05), 0.15)
    data = json.loads(json.dumps(summary.to_dict()))
    assert data["schema"] == SCHEMA and data["gpus"] == [] and data["backends"] == []
    assert data["overhead"]["samples"] == 0
    assert any(note.startswith(rocm_smi_note()) for note in data["notes"])


def test_sampler_reads_real_rocm_smi_output_through_the_subprocess_path(tmp_path):
    tool = write_tool(tmp_path, "rocm-smi", "rocm_smi_7900xtx.json")
    summary = _run(GpuSampler(interval=0.05, backends=[RocmSmiBackend(str(tool))]), 0.3)
    [gpu] = summary.gpus
    assert (gpu.vendor, gpu.gpu) == ("amd", 0) and gpu.samples >= 3
    assert gpu.memory_total_bytes == 25753026560
    assert gpu.metrics["power_w"].mean == 19.0 and gpu.metrics["temperature_c"].peak == 49.0
    assert gpu.metrics["memory_used_bytes"].peak == 794341376
    overhead = summary.overhead
    assert overhead.samples == gpu.samples and overhead.wall_ms > 0 and overhead.thread_cpu_ms > 0
    assert summary.errors == []


def test_mean_and_peak_follow_readings_that_change_between_samples(tmp_path):
    # Two real outputs in turn: 19 W / 49 °C (RX 7900 XTX) then 222 W / 77 °C (the RainbowMiner card).
    tool = write_tool(tmp_path, "rocm-smi", "rocm_smi_7900xtx.json", "rocm_smi_7900xtx.json", "rocm_smi_legacy_lowercase.json")
    backend = RocmSmiBackend(str(tool))
    backend.open()  # first call: the product-name query
    first, second = backend.read(), backend.read()
    assert (first[0].power_w, second[0].power_w) == (19.0, 222.0)
    sampler = GpuSampler(interval=0.05, backends=[RocmSmiBackend(str(write_tool(
        tmp_path / "b", "rocm-smi", "rocm_smi_7900xtx.json", "rocm_smi_7900xtx.json", "rocm_smi_legacy_lowercase.json")))])
    [gpu] = _run(sampler, 0.3).gpus
    power = gpu.metrics["power_w"]
    assert power.peak == 222.0 and 19.0 < power.mean < 222.0
    assert gpu.metrics["temperature_c"].peak == 77.0


def test_a_tool_that_breaks_mid_run_is_recorded_and_the_summary_stays_valid(tmp_path):
    tool = write_tool(tmp_path, "rocm-smi", "rocm_smi_7900xtx.json", after=2)
    summary = _run(GpuSampler(interval=0.05, backends=[RocmSmiBackend(str(tool))]), 0.3)
    assert summary.gpus[0].samples == 1  # the one read before the tool broke
    assert summary.errors and "failed (exit 1)" in summary.errors[0]


def test_a_tool_printing_something_other_than_json_is_unavailable_with_the_reason(tmp_path):
    tool = write_tool(tmp_path, "rocm-smi", "rocminfo_rx6800_gfx1030.txt")
    with pytest.raises(BackendUnavailable, match="did not print valid JSON"):
        RocmSmiBackend(str(tool)).open()


@pytest.mark.parametrize("interval", [0, -1, float("nan")])
def test_a_non_positive_interval_is_a_usage_error(interval):
    with pytest.raises(UsageError, match="positive number of seconds"):
        GpuSampler(interval=interval)
