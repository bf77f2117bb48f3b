"""NVIDIA discovery: nvidia-smi's CSV on a real output, and NVML through the real nvidia-ml-py without a driver."""

from __future__ import annotations

import pytest

from onnxaccel.system.gpus_nvidia import (
    NvidiaGpu, NvidiaInventory, NvmlUnavailable, cuda_findings, discover_nvidia, nvml, parse_nvidia_smi_csv,
)
from onnxaccel.system.telemetry_backends import BackendUnavailable, NvmlBackend
from tests.system.tool_outputs import FIXTURES, fixture_text


def _query() -> list[str]:
    header = (FIXTURES / "nvidia_smi_rtx2080.csv").read_text().split("# ---\n")[0]
    return next(ln for ln in header.splitlines() if ln.startswith("# query: "))[len("# query: "):].split(",")


def test_nvidia_smi_csv_of_an_rtx2080_maps_every_queried_field_and_na_becomes_none():
    [row] = parse_nvidia_smi_csv(fixture_text("nvidia_smi_rtx2080.csv"), _query())
    assert row["name"] == "GeForce RTX 2080" and row["driver_version"] == "440.64"
    assert (row["memory.total"], row["power.draw"], row["utilization.gpu"]) == ("7979", "176.98", "86")
    assert row["temperature.memory"] is None  # "N/A" on this card
    assert row["pstate"] == "P2"


def test_nvidia_smi_csv_with_fewer_values_than_fields_is_an_error():
    with pytest.raises(ValueError, match="19 values for 20 fields"):
        parse_nvidia_smi_csv(fixture_text("nvidia_smi_rtx2080.csv"), [*_query(), "extra.field"])


def test_nvml_without_a_driver_is_a_clean_no_nvidia_driver_reason(clean_env):
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra")
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):  # what the real library raises here
        pynvml.nvmlInit()
    with pytest.raises(NvmlUnavailable, match="no NVIDIA driver: libnvidia-ml.so.1"):
        with nvml():
            pass


def test_discovery_without_driver_or_nvidia_smi_finds_no_gpu_and_says_why(clean_env):
    pytest.importorskip("pynvml")
    inventory = discover_nvidia()
    assert inventory.gpus == [] and inventory.source == "none"
    assert any("no NVIDIA driver" in n for n in inventory.notes)
    assert any(n.startswith("nvidia-smi: nvidia-smi not found") for n in inventory.notes)


def test_nvml_telemetry_backend_without_driver_is_unavailable_not_an_exception(clean_env):
    pytest.importorskip("pynvml")
    with pytest.raises(BackendUnavailable, match="no NVIDIA driver"):
        NvmlBackend().open()


def test_driver_older_than_the_wheels_cuda_is_an_error_with_the_fix():
    inventory = NvidiaInventory([NvidiaGpu(0, "NVIDIA H200", "9.0", 150 * 2**30, 2**30)], "535.247.01", "12.2", "nvml")
    codes = {f.code: f for f in cuda_findings(inventory, "13.0", {})}
    assert "cuda-driver-too-old" in codes
    assert "supports CUDA 13" in codes["cuda-driver-too-old"].fix
    fine = {f.code for f in cuda_findings(NvidiaInventory(inventory.gpus, "580.1", "13.0", "nvml"), "13.0", {})}
    assert "cuda-driver-too-old" not in fine


def test_pip_cuda_libraries_of_the_other_major_are_flagged():
    inventory = NvidiaInventory([NvidiaGpu(0, "NVIDIA H200", "9.0")], "580.1", "13.0", "nvml")
    codes = {f.code for f in cuda_findings(inventory, "13.0", {"nvidia-cudnn-cu12": "9.1.0"})}
    assert "cuda-pip-mismatch" in codes
