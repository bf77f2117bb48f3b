"""Small real models built with onnx.helper, shared by tests (import as `from model_builders import ...`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]

def make_mlp(path: Path, *, ir_version: int = 8, opset: int = 17, batch: str | int = "batch") -> Path:
    """x[batch, 4] -> MatMul(4x8) -> Relu -> MatMul(8x3) -> Softmax: a tiny classifier with real weights."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["logits"], name="mm2"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 3])],
        initializer=[w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = ir_version
    onnx.save(model, str(path))
    return path


def make_string_input_model(path: Path) -> Path:
    """y = x * 2 (float: converts to FP16) beside s_out = Identity(s): a string input no feed can be drawn for."""
    c = numpy_helper.from_array(np.full((1, 4), 2.0, np.float32), "c")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "c"], ["y"], name="mul"), helper.make_node("Identity", ["s"], ["s_out"], name="id")],
        "strings",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("s", TensorProto.STRING, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("s_out", TensorProto.STRING, [1])],
        initializer=[c],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path
