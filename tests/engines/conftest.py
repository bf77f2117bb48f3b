"""Fixtures of the runner pool's tests (test_pool.py, test_pool_warm.py): the mlp compiled for the CPU, and a
plain ONNX Runtime session of it to compare with."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from onnxaccel.pipeline import compile_only
from onnxaccel.target import parse_target


@pytest.fixture()
def compiled(mlp_path):
    """The mlp bound at batch 1 and compiled for the CPU; ``new_runner()`` makes further sessions."""
    made = compile_only(str(mlp_path), parse_target("cpu"), batch=1)
    yield made
    made.close()


@pytest.fixture(scope="module")
def reference(mlp_path):
    session = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"x": x})[0]
