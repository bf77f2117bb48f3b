"""The gfx support table, HSA_OVERRIDE_GFX_VERSION, and the environment variables the doctor explains."""

from __future__ import annotations

import pytest

from onnxaccel.system.environment import environment_findings, relevant_environment
from onnxaccel.system.findings import ERROR, OK, WARN
from onnxaccel.system.gfx import check_gfx, gfx_from_override, override_for


@pytest.mark.parametrize("value, gfx", [("11.0.0", "gfx1100"), ("10.3.0", "gfx1030"), ("9.4.2", "gfx942"),
                                        ("9.0.10", "gfx90a"), ("12.0.1", "gfx1201"), ("11", None), ("abc", None)])
def test_hsa_override_value_names_the_gfx_target_it_spoofs(value, gfx):
    assert gfx_from_override(value) == gfx
    if gfx:
        assert override_for(gfx) == value


def test_gfx1030_has_rocm_wheel_kernels_but_is_not_a_migraphx_target():
    assert check_gfx("gfx1030", device="rocm").severity == OK
    finding = check_gfx("gfx1030", device="migraphx")
    assert (finding.severity, finding.code) == (WARN, "gfx-unsupported-migraphx")


def test_gfx950_is_a_migraphx_target_but_the_rocm_1_22_wheel_has_no_kernels_for_it():
    assert check_gfx("gfx950", device="migraphx").severity == OK
    finding = check_gfx("gfx950", device="rocm")
    assert (finding.severity, finding.code) == (ERROR, "gfx-unsupported-rocm-wheel")
    assert "--target migraphx" in finding.fix


def test_an_override_onto_a_supported_target_is_reported_as_spoofing_with_its_effect():
    finding = check_gfx("gfx1030", device="migraphx", override="11.0.0")
    assert finding.code == "gfx-overridden" and "treat it as gfx1100" in finding.title


def test_an_unsupported_family_member_gets_the_family_override_as_hint():
    finding = check_gfx("gfx1032", device="rocm")
    assert finding.severity == ERROR and "HSA_OVERRIDE_GFX_VERSION=10.3.0" in finding.fix


def test_environment_lists_only_relevant_variables_with_their_effect():
    env = {"HSA_OVERRIDE_GFX_VERSION": "11.0.0", "CUDA_VISIBLE_DEVICES": "1", "HOME": "/root",
           "ORT_MIGRAPHX_MODEL_CACHE_PATH": "/cache", "ORT_MIGRAPHX_SAVE_COMPILED_MODEL": "1"}
    settings = {s.name: s.effect for s in relevant_environment(env)}
    assert "HOME" not in settings
    assert settings["HSA_OVERRIDE_GFX_VERSION"] == "every AMD GPU runs as gfx1100"
    assert "renumbered from 0" in settings["CUDA_VISIBLE_DEVICES"]
    assert "removed in ROCm 6.4" in settings["ORT_MIGRAPHX_SAVE_COMPILED_MODEL"]


def test_hidden_gpus_malformed_override_and_mixed_rocm_paths_are_findings():
    env = {"HIP_VISIBLE_DEVICES": "-1", "HSA_OVERRIDE_GFX_VERSION": "gfx1100",
           "LD_LIBRARY_PATH": "/opt/rocm-6.4.1/lib:/opt/rocm-7.0.2/lib"}
    codes = {f.code for f in environment_findings(env)}
    assert codes == {"gpus-hidden", "hsa-override-malformed", "rocm-mixed-ld-path"}
    assert environment_findings({"CUDA_VISIBLE_DEVICES": "0"}) == []
