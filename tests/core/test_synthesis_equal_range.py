"""An integer input compared by Equal with a constant holding a contiguous run of integers (a one-hot spelled out,
as Magika's JAX export does) is synthesized within that run; a comparison with a single value tells no range.

Small graphs built in place; tests/core/test_magika_packaged.py checks the packaged model itself.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxaccel.pipeline import prepare
from onnxaccel.target import parse_target

CPU = parse_target("cpu")


def _save(path, nodes, inputs, outputs, initializers=()):
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(initializers)),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return str(path)


def test_equal_against_a_constant_node_of_a_shifted_range_bounds_the_input(tmp_path):
    """codes[8] int64 -> Unsqueeze -> Equal with a Constant node [1, 5] holding 3..7: drawn from [3, 8)."""
    path = _save(tmp_path / "onehot_equal.onnx",
                 [helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([1], np.int64))),
                  helper.make_node("Unsqueeze", ["codes", "axes"], ["col"]),
                  helper.make_node("Constant", [], ["classes"],
                                   value=numpy_helper.from_array(np.arange(3, 8, dtype=np.int64).reshape(1, 5))),
                  helper.make_node("Equal", ["col", "classes"], ["hot"], name="one_hot")],
                 [helper.make_tensor_value_info("codes", TensorProto.INT64, [64])],
                 [helper.make_tensor_value_info("hot", TensorProto.BOOL, [64, 5])])
    prepared = prepare(path, CPU)
    codes = prepared.feeds["codes"]
    assert codes.min() >= 3 and codes.max() < 8
    detail = prepared.synthesized[0].detail
    assert detail.startswith("integers in [3, 8)") and "Equal 'one_hot'" in detail and "3..7" in detail, detail
    assert prepared.run()["hot"].sum(axis=1).tolist() == [1] * 64  # one hot in every row


def test_equal_against_one_value_tells_no_range(tmp_path):
    """ids == 0 (a padding check) says nothing of the ids' range: the default range stays."""
    path = _save(tmp_path / "pad_check.onnx",
                 [helper.make_node("Equal", ["ids", "pad"], ["is_pad"], name="pad_check")],
                 [helper.make_tensor_value_info("ids", TensorProto.INT64, [16])],
                 [helper.make_tensor_value_info("is_pad", TensorProto.BOOL, [16])],
                 [numpy_helper.from_array(np.array(0, np.int64), "pad")])
    detail = prepare(path, CPU).synthesized[0].detail
    assert detail.startswith("integers in [0, 1000) (the default range"), detail
