"""Models and fixtures for the analysis tests: small graphs whose numbers are known by hand, a model FP16
really breaks, and a real second execution provider that takes no node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxruntime")


def _const(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), name)


def _save(nodes, inputs, outputs, initializers, path: Path, opset: int = 17) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="session")
def conv_path(tmp_path_factory) -> Path:
    """x[1, 4, 9, 9] -> Conv(8 filters of 2x3x3, group 2, stride 2, pad 1, bias) -> y[1, 8, 5, 5]."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((8, 2, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", group=2, strides=[2, 2],
                            pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    return _save([conv], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 5, 5])], [w, b],
                 tmp_path_factory.mktemp("models") / "conv.onnx")


@pytest.fixture(scope="session")
def clamped_path(tmp_path_factory) -> Path:
    """y = (relu(x) * 1e5 - 5e4) * 1e-5. FP16 cannot hold 1e5 (max 65504): the conversion clamps the
    constant, so node 'scale_up' is where FP16 and FP32 part."""
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu_in"),
        helper.make_node("Mul", ["h", "k_1e5"], ["big"], name="scale_up"),
        helper.make_node("Sub", ["big", "k_5e4"], ["centered"], name="center"),
        helper.make_node("Mul", ["centered", "k_1e-5"], ["y"], name="scale_down"),
    ]
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
                 [_const("k_1e5", 1e5), _const("k_5e4", 5e4), _const("k_1e-5", 1e-5)],
                 tmp_path_factory.mktemp("models") / "clamped.onnx")


@pytest.fixture()
def azure_as_cuda(monkeypatch):
    """Make the `cuda` target request AzureExecutionProvider, a real second provider in the CPU wheel of
    onnxruntime that claims none of the standard ops: ONNX Runtime's own partitioner then assigns every node
    to the CPU, exactly as it does with a GPU provider that lacks a kernel. Only the provider name changes;
    session creation, placement and the strict check are the real code paths."""
    import onnxruntime as ort

    if "AzureExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime build has no AzureExecutionProvider")
    from onnxaccel import target

    monkeypatch.setitem(target.PROVIDER, "cuda", "AzureExecutionProvider")
    return "AzureExecutionProvider"
