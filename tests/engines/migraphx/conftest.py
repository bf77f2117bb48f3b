"""Fixtures for the native MIGraphX engine's contract tests (helpers are in native_helpers.py).

NOT EXECUTED ON AMD HARDWARE. Two test doubles for AMD's ``migraphx``:

* ``fake_mgx``: ``fake_migraphx/migraphx``, a stand-in that mirrors the Python binding (signatures, argument
  objects, error texts; held to upstream by test_stand_in_fidelity.py and test_real_ref_fidelity.py) and
  computes with ONNX Runtime on the CPU. It is the only double for what needs a GPU.
* ``real_mgx``: the real MIGraphX built from upstream source with only its reference target
  (scripts/build-migraphx-ref, found by real_ref.py), with the engine pointed at ``get_target("ref")``. The
  test_real_ref_*.py tests skip, saying why, where that build is absent.

They prove the engine calls the API correctly and handles its answers; they do not prove MIGraphX compiles or
runs these models on a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from model_builders import make_mlp
import real_ref
from native_helpers import FAKE_DIR, use_module
from onnxaccel.model import load_model


@pytest.fixture
def fake_mgx(monkeypatch, tmp_path):
    """The stand-in module as `migraphx`, a fresh call log, and an empty onnxaccel cache."""
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("FAKE_MIGRAPHX_NO_GPU", "FAKE_MIGRAPHX_OLD", "FAKE_MIGRAPHX_COMPILE_S", "FAKE_MIGRAPHX_LOG"):
        monkeypatch.delenv(name, raising=False)
    module = use_module(monkeypatch, FAKE_DIR)
    module._calls.clear()
    return module


@pytest.fixture(scope="session")
def real_mgx_module():
    """AMD's real ``migraphx`` module of the reference-target build, imported once (a process can load a
    pybind11 extension from one path only); skips with the reason where the build is absent."""
    module, why = real_ref.locate()
    if module is None:
        pytest.skip(why)
    return real_ref.import_module(module)


@pytest.fixture
def real_mgx(real_mgx_module, monkeypatch, tmp_path):
    """The real module as `migraphx`, the native engine on MIGraphX's ref target, an empty onnxaccel cache."""
    monkeypatch.setitem(sys.modules, "migraphx", real_mgx_module)
    monkeypatch.setenv("ONNXACCEL_MIGRAPHX_TARGET", "ref")
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(tmp_path / "cache"))
    return real_mgx_module


@pytest.fixture(scope="session")
def mlp_file(tmp_path_factory) -> Path:
    return make_mlp(tmp_path_factory.mktemp("native") / "mlp.onnx")


@pytest.fixture
def mlp(mlp_file):
    """x[batch, 4] -> probs[batch, 3], bound to batch 2."""
    return load_model(mlp_file).bind(batch=2)


@pytest.fixture(scope="session")
def conv_file(tmp_path_factory) -> Path:
    """A small CNN (Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm): the ops INT8 quantizes."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w")
    fc = numpy_helper.from_array(rng.standard_normal((4, 5)).astype(np.float32), "fc")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc"], ["logits"], name="fc"),
    ]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 5])],
                              initializer=[w, fc])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path_factory.mktemp("native") / "cnn.onnx"
    onnx.save(model, str(path))
    return path


@pytest.fixture
def cnn(conv_file):
    return load_model(conv_file).bind(batch=2)
