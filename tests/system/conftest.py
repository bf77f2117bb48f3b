"""Fixtures for the system tests; the helpers they use live in tool_outputs.py (importable by name)."""

from __future__ import annotations

import os

import pytest

from tests.system.tool_outputs import write_tool


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No GPU tools, no ROCm, no GPU-related variables: what this machine really is, made explicit."""
    for name in list(os.environ):
        if name.startswith(("HSA_", "HIP_", "ROCR_", "CUDA_", "ORT_MIGRAPHX_", "MIGRAPHX_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))
    return monkeypatch


@pytest.fixture
def tools(clean_env, tmp_path):
    """``tools("rocminfo", "rocminfo_rx6800_gfx1030.txt")`` puts a stand-in first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    clean_env.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def install(tool: str, *outputs: str, **kwargs) -> Path:
        return write_tool(bin_dir, tool, *outputs, **kwargs)

    return install
