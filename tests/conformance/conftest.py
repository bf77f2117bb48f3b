"""ONNX's own backend test cases, as the onnx wheel ships them and as its node generators write them."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from model_builders import ROOT

from onnxaccel.conformance.onnx_suites import shipped_data_dir, suite_dir


@pytest.fixture(scope="session")
def onnx_data() -> Path:
    return shipped_data_dir()


@pytest.fixture(scope="session")
def node_dir() -> Path:
    """The ~1900 node cases, written once into the test cache (a few seconds)."""
    return suite_dir("node")


@pytest.fixture
def case_copy(tmp_path, onnx_data):
    """Copy a shipped case into tmp_path (to perturb it): case_copy('simple/test_sign_model') -> its folder."""

    def copy(relative: str) -> Path:
        dest = tmp_path / Path(relative).name
        shutil.copytree(onnx_data / relative, dest)
        return dest

    return copy


@pytest.fixture(scope="session")
def benchmark_module():
    """benchmarks/conformance.py, whose plain-ONNX-Runtime reference the CI slice compares against."""
    spec = importlib.util.spec_from_file_location("conformance_benchmark", ROOT / "benchmarks" / "conformance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
