"""One GPU-reading type: the telemetry backends and the AMD tool parsers give the same GpuSample, whose dict
keeps the telemetry keys and adds the inventory fields only where a listing gave them."""

from __future__ import annotations

from onnxaccel.system import telemetry_backends
from onnxaccel.system.amd_parsers import parse_amd_smi_json, parse_rocm_smi_json
from onnxaccel.system.gpu_sample import GpuSample
from tests.system.tool_outputs import fixture_text

READING_KEYS = ["gpu", "name", "vendor", "utilization_pct", "memory_used_bytes", "memory_total_bytes", "power_w",
                "temperature_c", "gfx_clock_mhz", "mem_clock_mhz"]


def test_parsers_and_backends_share_the_type():
    assert telemetry_backends.GpuSample is GpuSample
    [card] = parse_rocm_smi_json(fixture_text("rocm_smi_7900xtx.json"))
    [gpu] = parse_amd_smi_json('[{"gpu": 0, "asic": {"target_graphics_version": "gfx1100"}}]')
    assert type(card) is type(gpu) is GpuSample
    assert (card.vendor, gpu.vendor, gpu.gfx) == ("amd", "amd", "gfx1100")


def test_to_dict_keys_are_the_telemetry_keys_plus_inventory_fields_only_when_set():
    reading = GpuSample(0, "GPU", "nvidia", utilization_pct=50.0)
    assert list(reading.to_dict()) == READING_KEYS
    listed = GpuSample(1, None, "amd", gfx="gfx942", compute_units=304)
    assert list(listed.to_dict()) == [*READING_KEYS, "gfx", "compute_units"]
