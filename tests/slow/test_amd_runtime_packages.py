"""What users of AMD's ONNX Runtime builds see on a machine without ROCm, proved with the real packages.

No AMD GPU or ROCm exists here: these tests install the real wheels from PyPI into throwaway venvs and
assert on the real load errors and on onnxaccel's translation of them. Nothing here ran on AMD hardware.
"""

from __future__ import annotations

import json

import pytest

from model_builders import make_mlp
from venvs import run_cli, throwaway_venv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def migraphx_python():
    return throwaway_venv(["onnxruntime-migraphx==1.27.1"])


@pytest.fixture(scope="module")
def rocm_python():
    # onnxruntime-rocm declares no dependencies at all (rocm_facts.md §1.2): numpy must come separately.
    return throwaway_venv(["onnxruntime-rocm==1.22.2.post3", "numpy<3"])


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return make_mlp(tmp_path_factory.mktemp("amd") / "mlp.onnx")


def test_migraphx_wheel_without_rocm_fails_loudly_with_the_fix(migraphx_python, mlp):
    proc = run_cli(migraphx_python, "run", str(mlp), "--target", "migraphx/fp16", "--json")
    assert proc.returncode == 1
    error = json.loads(proc.stdout)
    assert error["error"] == "ProviderUnavailableError"
    assert error["message"].startswith("MIGraphXExecutionProvider did not load: libmigraphx_c.so.3 (MIGraphX (AMD))")
    assert "ROCm 7.x with MIGraphX" in error["hint"]
    # The runtime's own words are kept verbatim for --debug and bug reports.
    assert "libmigraphx_c.so.3: cannot open shared object file" in error["details"]


def test_migraphx_wheel_rejects_the_removed_rocm_ep_with_an_explanation(migraphx_python, mlp):
    proc = run_cli(migraphx_python, "run", str(mlp), "--target", "rocm")
    assert proc.returncode == 2
    assert "removed from ONNX Runtime in 1.23" in proc.stderr and "1.27.1" in proc.stderr


def test_migraphx_wheel_has_no_cuda_and_says_which_package_has_it(migraphx_python, mlp):
    proc = run_cli(migraphx_python, "run", str(mlp), "--target", "cuda")
    assert proc.returncode == 1
    text = " ".join(proc.stderr.split())
    assert "not part of the installed ONNX Runtime (onnxruntime-migraphx 1.27.1" in text
    assert "[cuda]'" in text and "pip install" in text  # the extra, installed as onnxaccel was


def test_auto_target_skips_the_listed_but_unloadable_migraphx(migraphx_python, mlp):
    proc = run_cli(migraphx_python, "run", str(mlp), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["target"] == "cpu"
    assert "skipped migraphx: libmigraphx_c.so.3" in " ".join(proc.stderr.split())


def test_rocm_wheel_silent_cpu_fallback_is_caught(rocm_python, mlp):
    # onnxruntime-rocm 1.22 logs the load error and quietly runs on the CPU, even with enable_fallback=0.
    proc = run_cli(rocm_python, "run", str(mlp), "--target", "rocm", "--json")
    assert proc.returncode == 1
    error = json.loads(proc.stdout)
    assert error["message"].startswith("ROCMExecutionProvider did not load (libhipblas.so.3 (hipBLAS (ROCm))")
    assert "would have run the model on CPUExecutionProvider" in error["message"]
    assert "TryGetProviderInfo_ROCM" in error["details"]


def test_rocm_wheel_placement_comes_from_profiling_on_runtimes_before_1_24(rocm_python, mlp):
    proc = run_cli(rocm_python, "run", str(mlp), "--target", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    placement = json.loads(proc.stdout)["placement"]
    assert placement["method"] == "profiling"
    assert placement["per_provider"] == {"CPUExecutionProvider": placement["total_nodes"]}
    assert placement["total_nodes"] >= 3
