"""`onnxaccel doctor`, library and command line, on this machine (CPU only) and with AMD tool stand-ins."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from onnxaccel.install import install_mode
from onnxaccel.cli.main import app
from onnxaccel.errors import TargetError
from onnxaccel.system.doctor import SCHEMA, run_doctor

runner = CliRunner()


def _doctor_json(*args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["doctor", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def test_on_this_machine_the_cpu_target_is_ready_and_no_gpu_is_found(clean_env):
    report = run_doctor()
    assert report.ok and report.verdict("cpu").ready and report.verdict("cpu").built
    assert [v.target for v in report.targets] == ["cpu"]  # the CPU wheel builds no GPU provider
    assert report.nvidia.gpus == [] and report.amd.gpus == []
    assert "no-gpu" in {f.code for f in report.findings}


def test_json_output_carries_the_schema_and_exits_0(clean_env):
    code, data = _doctor_json()
    assert code == 0 and data["schema"] == SCHEMA and data["ok"] is True
    assert data["targets"][0]["target"] == "cpu" and data["targets"][0]["ready"] is True


def test_target_cuda_is_not_ready_here_exits_1_and_names_the_package_to_install(clean_env):
    code, data = _doctor_json("--target", "cuda")
    assert code == 1 and data["ok"] is False and data["requested"] == "cuda"
    [cuda] = data["targets"]
    assert cuda["ready"] is False and cuda["built"] is False
    assert install_mode().install("cuda") in cuda["fix"] and "onnxruntime-gpu" in cuda["fix"]
    assert any("no NVIDIA GPU found" in w for w in cuda["warnings"])


def test_target_cpu_is_ready_and_exits_0(clean_env):
    code, data = _doctor_json("--target", "cpu")
    assert code == 0 and data["targets"][0]["ready"] is True


def test_a_target_with_options_is_judged_by_its_full_string(clean_env):
    report = run_doctor("cpu?intra_op_num_threads=1")
    assert report.requested == "cpu?intra_op_num_threads=1" and report.ok
    assert report.verdict("cpu?intra_op_num_threads=1").ready


def test_rocm_target_on_ort_1_23_or_newer_explains_the_ep_was_removed(clean_env):
    [rocm] = run_doctor("rocm").targets
    assert not rocm.ready and "removed in ONNX Runtime 1.23" in rocm.cause and "--target migraphx" in rocm.fix


def test_a_malformed_target_is_a_usage_error_with_a_hint_and_no_traceback(clean_env):
    result = runner.invoke(app, ["doctor", "--target", "quantum"])
    assert result.exit_code == 2
    assert "Unknown target device 'quantum'" in result.output and "Traceback" not in result.output
    with pytest.raises(TargetError):
        run_doctor("quantum")


def test_an_amd_gpu_from_rocminfo_is_shown_and_gfx1030_is_flagged_for_migraphx(tools):
    tools("rocminfo", "rocminfo_rx6800_gfx1030.txt")
    report = run_doctor("migraphx")
    [gpu] = report.amd.gpus
    assert (gpu.gfx, gpu.name, gpu.vram_total_bytes) == ("gfx1030", "AMD Radeon RX 6800", 16760832 * 1024)
    assert report.amd.source == "rocminfo"
    [verdict] = report.targets
    assert not verdict.ready  # the CPU wheel has no MIGraphX EP
    assert any("gfx1030 is not a target MIGraphX supports" in w for w in verdict.warnings)
    codes = {f.code for f in report.findings}
    assert {"amd-gpus", "rocm-missing"} <= codes and "no-gpu" not in codes


def test_hsa_override_is_shown_with_its_effect_on_the_gpus_found(tools, clean_env):
    tools("rocminfo", "rocminfo_r9700x3_gfx1201.txt")
    clean_env.setenv("HSA_OVERRIDE_GFX_VERSION", "11.0.0")
    report = run_doctor("migraphx")
    assert len(report.amd.gpus) == 3
    [setting] = [s for s in report.environment if s.name == "HSA_OVERRIDE_GFX_VERSION"]
    assert setting.effect == "every AMD GPU runs as gfx1100"
    assert sum("gfx1201 runs as gfx1100" in w for w in report.targets[0].warnings) == 3


def test_human_output_has_the_sections_and_the_verdict(clean_env):
    result = runner.invoke(app, ["doctor", "--target", "cpu"])
    assert result.exit_code == 0
    for text in ("System", "ONNX Runtime", "Targets", "Findings", "cpu: ready"):
        assert text in result.output


def test_a_broken_rocminfo_is_a_note_not_a_crash(tools):
    tools("rocminfo", "rocm_smi_7900xtx.json", exit_code=1)
    report = run_doctor()
    assert report.amd.gpus == [] and any(n.startswith("rocminfo:") for n in report.amd.notes)
