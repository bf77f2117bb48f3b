"""Parsers of rocminfo, rocm-smi --json and amd-smi --json, on real outputs (see each fixture's source)."""

from __future__ import annotations

import pytest

from onnxaccel.system.amd_parsers import ToolOutputError, parse_amd_smi_json, parse_rocm_smi_json, parse_rocminfo
from tests.system.tool_outputs import fixture_text


def test_rocminfo_rx6800_gives_one_gfx1030_gpu_with_its_cus_and_16_gib_skipping_the_cpu_agent():
    report = parse_rocminfo(fixture_text("rocminfo_rx6800_gfx1030.txt"))
    assert report.runtime_version == "1.1" and report.kfd_version is None  # "ROCk module is loaded" (no version)
    [gpu] = report.gpus
    assert (gpu.gfx, gpu.marketing_name, gpu.compute_units, gpu.max_clock_mhz) == ("gfx1030", "AMD Radeon RX 6800", 60, 2475)
    assert gpu.vram_bytes == 16760832 * 1024  # the GPU's COARSE GRAINED pool, not the CPU's 62 GiB one
    assert gpu.isa == ["gfx1030"]


def test_rocminfo_r9700_gives_three_gfx1201_gpus_with_distinct_uuids_and_the_kfd_version():
    report = parse_rocminfo(fixture_text("rocminfo_r9700x3_gfx1201.txt"))
    assert report.kfd_version == "6.12.12" and report.runtime_version == "1.18"
    assert [g.gfx for g in report.gpus] == ["gfx1201"] * 3
    assert [g.uuid for g in report.gpus] == ["GPU-122f60a0a7d06c96", "GPU-3919877325193652", "GPU-b206404c71c2dfec"]
    assert [g.node for g in report.gpus] == [1, 2, 3]
    assert all(g.compute_units == 64 and g.vram_bytes == 33406976 * 1024 for g in report.gpus)
    assert report.gpus[0].isa == ["gfx1201", "gfx12-generic"]


def test_rocminfo_parser_rejects_text_that_is_not_rocminfo():
    with pytest.raises(ToolOutputError, match="not rocminfo output"):
        parse_rocminfo(fixture_text("rocm_smi_7900xtx.json"))


def test_rocm_smi_json_of_a_7900xtx_gives_use_memory_average_power_and_edge_temperature():
    [card] = parse_rocm_smi_json(fixture_text("rocm_smi_7900xtx.json"))
    assert card.gpu == 0
    assert (card.utilization_pct, card.power_w, card.temperature_c) == (0.0, 19.0, 49.0)
    assert (card.memory_used_bytes, card.memory_total_bytes) == (794341376, 25753026560)


def test_rocm_smi_json_of_an_old_release_with_lowercase_c_temperature_keys_is_read():
    [card] = parse_rocm_smi_json(fixture_text("rocm_smi_legacy_lowercase.json"))
    assert (card.power_w, card.temperature_c) == (222.0, 77.0)  # edge, not junction (103) or mem (79)
    assert card.memory_total_bytes is None and card.utilization_pct is None


def test_rocm_smi_product_name_is_read_and_its_arithmetic_gfx_version_is_not_trusted():
    [card] = parse_rocm_smi_json(fixture_text("rocm_smi_7900xt_productname.json"))
    assert card.name == "Radeon RX 7900 XT" and card.memory_total_bytes == 21458059264
    assert card.gfx is None  # "GFX Version" is computed wrongly for gfx90a (rocm_facts.md §6.2): never used


def test_rocm_smi_power_key_matches_average_and_current_socket_but_never_max():
    # Key spellings as printed by rocm-smi on MI250 / APUs (ROCm/rocm_smi_lib#149, henrygd/beszel#414).
    text = ('{"card0": {"Max Graphics Package Power (W)": "560.0", "Current Socket Graphics Package Power (W)": "4.0"},'
            ' "card1": {"Average Graphics Package Power (W)": "N/A (Secondary die)"}, "system": {"Driver version": "6.7.0"}}')
    first, second = parse_rocm_smi_json(text)
    assert first.power_w == 4.0 and second.power_w is None
    assert [c.gpu for c in (first, second)] == [0, 1]  # "system" is not a card


def test_truncated_amd_smi_output_is_a_clear_error_not_a_traceback():
    with pytest.raises(ToolOutputError, match="stops before it is complete"):
        parse_amd_smi_json(fixture_text("amd_smi_metric_r9700_head40.txt"))


@pytest.mark.parametrize("text, expected", [
    # The first GPU of `amd-smi metric -u --json` on a Radeon Pro W7700 (ROCm 6.x list layout), trimmed to
    # its gfx_activity and closed (henrygd/beszel#737).
    ('[{"gpu": 0, "usage": {"gfx_activity": {"value": 42, "unit": "%"}}}]', 42.0),
    # The same key in the ROCm 7 layout, from the R9700 output above (ROCm/ROCm#5706), trimmed and closed.
    ('{"gpu_data": [{"gpu": 0, "usage": {"gfx_activity": {"value": 100, "unit": "%"}}}]}', 100.0),
])
def test_amd_smi_json_is_read_in_both_the_list_and_the_gpu_data_layouts(text, expected):
    [gpu] = parse_amd_smi_json(text)
    assert gpu.gpu == 0 and gpu.utilization_pct == expected


def test_amd_smi_mb_are_mebibytes_and_na_is_none():
    # Values as amd-smi printed them for an RX 7800 XT: used_vram 14569 MB of 16368 MB (nathaninline/ajean#39).
    text = ('{"gpu_data": [{"gpu": 0, "mem_usage": {"total_vram": {"value": 16368, "unit": "MB"}, '
            '"used_vram": {"value": 14569, "unit": "MB"}}, "power": {"socket_power": "N/A"}}]}')
    [gpu] = parse_amd_smi_json(text)
    assert gpu.memory_total_bytes == 16368 * 2**20 and gpu.memory_used_bytes == 14569 * 2**20
    assert gpu.power_w is None


def test_amd_smi_json_of_an_unknown_shape_is_rejected():
    with pytest.raises(ToolOutputError, match="neither a list"):
        parse_amd_smi_json('{"something": 1}')
