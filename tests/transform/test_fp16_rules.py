"""The kernel limits FP16 conversion works around, held to ONNX Runtime's source and to the installed build."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxaccel.precision.fp16 import convert_fp16_detailed
from onnxaccel.precision.fp16_rules import RUNTIME_FP16_LIMITS

UPSTREAM = Path(__file__).parent / "upstream" / "ort_scatter_nd_fp16.txt"
_REFUSAL = re.compile(r"MLFloat16 data type is not supported with (\w+) opset \d+ when reduction is '(\w+)'")


def test_scatter_nd_limits_match_onnx_runtime_source():
    quoted = {(op, value) for op, value in _REFUSAL.findall(UPSTREAM.read_text())}
    ours = {(op, value) for provider, op, _, values in RUNTIME_FP16_LIMITS if op == "ScatterND" for value in values}
    assert quoted == ours == {("ScatterND", r) for r in ("add", "mul", "min", "max")}


def _scatter_nd(elem: int, reduction: str) -> onnx.ModelProto:
    node = helper.make_node("ScatterND", ["data", "indices", "updates"], ["y"], reduction=reduction, name="s")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("data", elem, [4]), helper.make_tensor_value_info("updates", elem, [2])],
        [helper.make_tensor_value_info("y", elem, [4])],
        [helper.make_tensor("indices", TensorProto.INT64, [2, 1], [0, 2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("reduction", ["add", "max"])
def test_installed_onnx_runtime_still_refuses_float16_scatter_nd_reductions(reduction):
    """If a newer ONNX Runtime gains the kernel, this fails: drop the rule then."""
    session = ort.InferenceSession(_scatter_nd(TensorProto.FLOAT16, reduction).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    feeds = {"data": np.ones(4, np.float16), "updates": np.ones(2, np.float16)}
    with pytest.raises(Exception, match="MLFloat16 data type is not supported with ScatterND"):
        session.run(None, feeds)


def test_conversion_keeps_a_refused_reduction_fp32_and_converts_plain_scatter():
    with pytest.raises(Exception, match="reduction='add'"):
        convert_fp16_detailed(_scatter_nd(TensorProto.FLOAT, "add"), provider="CPUExecutionProvider")
    plain = convert_fp16_detailed(_scatter_nd(TensorProto.FLOAT, "none"), provider="CPUExecutionProvider")
    assert plain.converted == {"ScatterND": 1}
    # Without a provider to honour (e.g. converting for a GPU build not installed here) nothing is kept.
    assert convert_fp16_detailed(_scatter_nd(TensorProto.FLOAT, "add")).converted == {"ScatterND": 1}
