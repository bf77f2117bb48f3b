"""A server compiles its models without feeds of its own (pipeline.compile_only): a model whose inputs no feed
can be drawn for (strings) loads at a precision onnxaccel converts, where a feed-building prepare refused it."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.repository import load_instance


def test_a_string_input_model_is_served_in_fp16_without_drawing_feeds(tmp_path):
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
    path = tmp_path / "strings.onnx"
    onnx.save(model, str(path))
    instance = load_instance(ModelConfig(name="strings", source=str(path), target="cpu", precision="fp16", max_batch=1))
    try:
        assert any("converted to FP16" in w for w in instance.warnings)
    finally:
        instance.close()
