"""Diagnoses proved against real packages from PyPI in throwaway virtual environments (marked slow).

Each environment is cached under .pytest_cache/onnxaccel-venvs/, keyed by the Python version, this
checkout's path (the editable install points at it) and the package list, so a second run reuses it.

(b) uses onnxruntime + onnxruntime-migraphx (17 + 21 MB) rather than onnxruntime + onnxruntime-gpu: the
GPU wheel is 255 MB (rocm_facts.md §7) and would not download and unpack within the ~2 minutes a slow test
may take; any two distributions that ship the `onnxruntime` module conflict the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".pytest_cache" / "onnxaccel-venvs"
pytestmark = pytest.mark.slow


def venv_with(*steps: tuple[str, ...]) -> Path:
    """A venv where each step was ``pip install``ed in order (order matters: the last wheel's files win)."""
    key = hashlib.sha256(json.dumps([sys.version, str(ROOT), steps]).encode()).hexdigest()[:16]
    venv = CACHE / key
    if (venv / ".complete").is_file():
        return venv
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for step in steps:
        done = subprocess.run([*pip, *step], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"pip install {' '.join(step)} failed:\n{done.stdout}\n{done.stderr}"
    (venv / ".complete").write_text("\n".join(" ".join(s) for s in steps))
    return venv


def doctor_in(venv: Path, tmp_path: Path, *args: str) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HSA_", "HIP_", "ROCR_", "CUDA_", "ORT_"))}
    env.update(PATH=f"{venv / 'bin'}:/usr/bin:/bin", ROCM_PATH=str(tmp_path / "no-rocm"), COLUMNS="200")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(venv / "bin" / "onnxaccel"), "doctor", "--json", *args], capture_output=True,
                          text=True, timeout=120, env=env)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"doctor did not print JSON (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")


def test_migraphx_wheel_without_rocm_is_not_ready_with_the_real_error_and_our_fix(tmp_path):
    venv = venv_with(("onnxruntime-migraphx==1.27.1", "numpy", "amdsmi==7.0.2"), ("-e", str(ROOT)))
    code, data = doctor_in(venv, tmp_path, "--target", "migraphx")
    assert code == 1 and data["ok"] is False
    [verdict] = data["targets"]
    assert verdict["built"] is True and verdict["ready"] is False  # listed by the wheel, does not load
    assert "libmigraphx_c.so.3: cannot open shared object file" in verdict["details"]
    assert verdict["cause"].startswith("libmigraphx_c.so.3 (MIGraphX (AMD)) cannot be loaded")
    assert "Install ROCm 7.x with MIGraphX" in verdict["fix"] and "apt install migraphx" in verdict["fix"]
    assert data["packages"]["distributions"] == {"onnxruntime-migraphx": "1.27.1"}
    assert "rocm-missing" in {f["code"] for f in data["findings"]}
    # amdsmi 7.0.2 is installed but ROCm's libamd_smi.so is not: KeyError at import, caught, and its printing
    # did not corrupt the JSON above.
    assert any("libamd_smi.so" in note for note in data["gpus"]["amd"]["notes"])


def test_two_onnxruntime_distributions_are_reported_as_a_conflict_naming_what_to_uninstall(tmp_path):
    venv = venv_with(("onnxruntime==1.32.0",), ("onnxruntime-migraphx==1.27.1",), ("-e", str(ROOT)))
    code, data = doctor_in(venv, tmp_path)
    findings = {f["code"]: f for f in data["findings"]}
    conflict = findings["ort-conflict"]
    assert "onnxruntime 1.32.0" in conflict["title"] and "onnxruntime-migraphx 1.27.1" in conflict["title"]
    assert "Keep onnxruntime (no GPU was found), uninstall onnxruntime-migraphx" in conflict["fix"]
    assert "pip uninstall -y onnxruntime onnxruntime-migraphx && pip install onnxruntime==1.32.0" in conflict["fix"]
    # onnxruntime-migraphx was installed second, so the module on disk is its build (RECORD hashes say so).
    assert data["packages"]["module_version"] == "1.27.1"
    assert "onnxruntime" in data["packages"]["overwritten"]
    assert "not to onnxruntime" in findings["ort-module-mixed"]["title"]
    assert data["runtime"]["version"] == "1.27.1" and code == 0  # the CPU EP of the surviving build still works
