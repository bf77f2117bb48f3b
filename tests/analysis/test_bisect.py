"""Bisection to the first diverging node, on FP32 vs FP16 pairs that really diverge."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxaccel import load_model, parse_target
from onnxaccel.analysis.bisect import find_divergence
from onnxaccel.inputs import synthesize

CPU, CPU_FP16 = parse_target("cpu"), parse_target("cpu/fp16")


def _run(path, *, shapes=None, atol=1e-2, rtol=5e-2, per_session=4):
    model = load_model(path).bind(shapes)
    return find_divergence(model, CPU, CPU_FP16, synthesize(model), atol=atol, rtol=rtol, per_session=per_session)


def test_names_the_node_whose_constant_fp16_cannot_hold(clamped_path):
    result = _run(clamped_path)
    assert result.found
    assert (result.node, result.op_type, result.tensor) == ("scale_up", "Mul", "big")
    assert result.error.rel_l2 > 0.3
    assert [(c.tensor, c.passed) for c in result.inputs] == [("h", True)]
    assert result.causes == ("'k_1e5' holds values up to 1e+05, above FP16's largest finite value 65504",)
    assert result.to_dict()["schema"] == "onnxaccel.bisect/1"


def test_finds_the_broken_batchnorm_of_a_pretrained_detector(pretrained_det):
    # PP-OCRv4's detector keeps running variances up to ~1e8 in one BatchNormalization of its head; FP16
    # tops out at 65504, so the converted model normalizes with the wrong scale there and the output map is
    # garbage (cosine ~0.01). The search must land on that node, not on the rounding noise before it.
    result = _run(pretrained_det, shapes={"x": (1, 3, 96, 96)})
    assert result.found
    assert (result.node, result.op_type) == ("p2o.BatchNormalization.1", "BatchNormalization")
    assert any("batch_norm_0.w_2" in c and "65504" in c for c in result.causes)
    assert all(c.passed for c in result.inputs)
    # A few tensors per session: far fewer sessions than candidates (2 per round plus the first two runs).
    assert result.candidates > 300
    assert result.sessions <= 2 + 2 * (math.ceil(math.log(result.candidates, 5)) + 2)


def test_interleaved_branches_are_followed_back_to_the_cause(tmp_path):
    """The topological order interleaves a broken branch with healthy ones; checking the culprit's inputs
    sends the search back up the broken branch."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a0"], name="a0"),
        helper.make_node("Mul", ["a0", "k_big"], ["a1"], name="a1"),
        helper.make_node("Neg", ["x"], ["b0"], name="b0"),
        helper.make_node("Relu", ["b0"], ["b1"], name="b1"),
        helper.make_node("Abs", ["b1"], ["b2"], name="b2"),
        helper.make_node("Neg", ["b2"], ["b3"], name="b3"),
        helper.make_node("Abs", ["b3"], ["b4"], name="b4"),
        helper.make_node("Mul", ["a1", "k_small"], ["a2"], name="a2"),
        helper.make_node("Add", ["a2", "b4"], ["y"], name="merge"),
    ]
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
                              initializer=[numpy_helper.from_array(np.array(2e5, np.float32), "k_big"),
                                           numpy_helper.from_array(np.array(1e-5, np.float32), "k_small")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "branches.onnx"
    onnx.save(model, str(path))
    for per_session in (1, 3):
        result = _run(path, per_session=per_session)
        assert result.found and result.node == "a1", (per_session, result.message)


def test_agreeing_outputs_have_nothing_to_bisect(pretrained_cls):
    result = _run(pretrained_cls, shapes={"x": (1, 3, 48, 192)})
    assert not result.found and "agree" in result.message and result.sessions == 2


def test_accumulated_rounding_is_not_blamed_on_one_node():
    # With atol 1e-6, near-zero elements of BERT's hidden state fail element-wise, but no tensor's error
    # is large as a whole: there is no node to blame, and the result says so.
    model = load_model("zoo:bert-tiny").bind(batch=1)
    result = find_divergence(model, CPU, CPU_FP16, synthesize(model), atol=1e-6, rtol=1e-2)
    assert not result.found and "accumulated" in result.message and result.sessions == 2


def test_rejects_nonsense_arguments(clamped_path):
    from onnxaccel.errors import UsageError

    model = load_model(clamped_path).bind()
    with pytest.raises(UsageError):
        find_divergence(model, CPU, CPU_FP16, synthesize(model), atol=-1, rtol=0.1)
    with pytest.raises(ValueError):
        find_divergence(model, CPU, CPU_FP16, synthesize(model), atol=0.1, rtol=0.1, per_session=0)
