"""The real AMD ONNX Runtime wheels from PyPI, read the way a user's install is read: their flavour comes from
their own libraries, and options they do not declare are refused by onnxaccel, not by ONNX Runtime.

NOT EXECUTED ON AMD HARDWARE: the wheels install in throwaway venvs (tests/venvs.py) on a machine without
ROCm; their providers never load here, which is why every refusal below must come before the session.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_builders import make_mlp
from venvs import run_cli, throwaway_venv

pytestmark = pytest.mark.slow
UPSTREAM = Path(__file__).parent / "upstream"


@pytest.fixture(scope="module")
def migraphx_python():
    return throwaway_venv(["onnxruntime-migraphx==1.27.1"])


@pytest.fixture(scope="module")
def rocm_python():
    return throwaway_venv(["onnxruntime-rocm==1.22.2.post3", "numpy<3"])


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return make_mlp(tmp_path_factory.mktemp("flavours") / "mlp.onnx")


def test_the_1_27_1_wheel_is_read_from_its_provider_library(migraphx_python):
    proc = run_cli(migraphx_python, "doctor", "--target", "migraphx", "--json")
    build = json.loads(proc.stdout)["ort_build"]
    assert (build["distribution"], build["version"]) == ("onnxruntime-migraphx", "1.27.1")
    assert build["evidence"].startswith("libonnxruntime_providers_migraphx.so")
    assert build["migraphx"]["name"] == "ort-1.23+" and build["migraphx"]["true"] == "1"
    vendored = (UPSTREAM / "ort_wheel_onnxruntime_migraphx-1.27.1.txt").read_text().splitlines()
    assert set(build["migraphx"]["declared_keys"]) == {s for s in vendored if s and s[0].islower()}


def test_a_key_the_installed_build_lacks_is_refused_before_the_session(migraphx_python, mlp):
    proc = run_cli(migraphx_python, "run", str(mlp), "--target", "migraphx?migraphx_max_dynamic_batch=4", "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = json.loads(proc.stdout)
    assert error["error"] == "ProviderOptionError"
    assert "onnxruntime-migraphx 1.27.1 does not declare the MIGraphX option 'migraphx_max_dynamic_batch'" in \
        error["message"]
    assert 'Unknown provider option' in error["message"]


def test_int8_on_a_float_model_is_refused_on_the_real_wheel(migraphx_python, mlp):
    proc = run_cli(migraphx_python, "run", str(mlp), "--target", "migraphx/int8", "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = json.loads(proc.stdout)
    assert "would not run INT8" in error["message"] and "--int8 static" in error["hint"]


def test_the_rocm_wheel_has_no_migraphx_parser(rocm_python):
    proc = run_cli(rocm_python, "doctor", "--target", "cpu", "--json")
    build = json.loads(proc.stdout)["ort_build"]
    assert (build["distribution"], build["version"]) == ("onnxruntime-rocm", "1.22.2.post3")
    assert build["migraphx"] is None and build["rocm_ep"] is True
