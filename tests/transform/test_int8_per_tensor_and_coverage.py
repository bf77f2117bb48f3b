"""INT8 that reaches little of the model says so, and a per-channel quantizer failure falls back to per tensor.

No packaged integer-input classifier exists among the test packages, so the one for the fallback is built here:
input_ids[batch, seq] int64 -> Gather (embedding) -> ReduceMean -> Gemm whose bias C is [1, classes], the 2-D
bias a Paddle/TF export writes; ONNX Runtime's per-channel bias check fails on it with a numpy message. The
coverage test uses the pretrained PP-OCR direction classifier (a CNN with one Gemm head).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

SHAPE = ["--shape", "x=1x3x48x192"]


@pytest.fixture(scope="module")
def token_classifier(tmp_path_factory):
    rng = np.random.default_rng(0)
    vocab, width, classes = 100, 32, 4
    inits = [numpy_helper.from_array(rng.standard_normal((vocab, width)).astype(np.float32), "embedding"),
             numpy_helper.from_array(rng.standard_normal((width, classes)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, classes)).astype(np.float32), "B"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["embedded"], name="embed"),
             helper.make_node("ReduceMean", ["embedded", "axes"], ["pooled"], name="pool", keepdims=0),
             helper.make_node("Gemm", ["pooled", "W", "B"], ["logits"], name="head")]
    graph = helper.make_graph(nodes, "token_classifier",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="tests")
    model.ir_version = 9
    path = tmp_path_factory.mktemp("models") / "token_classifier.onnx"
    onnx.save(model, str(path))
    return path


def test_static_int8_with_a_2d_gemm_bias_falls_back_to_per_tensor_and_says_so(invoke, token_classifier, tmp_path):
    out = tmp_path / "tokens.int8.onnx"
    result = invoke("optimize", token_classifier, "-o", out, "-t", "cpu", "--int8", "static", "--calibration",
                    "synthetic", "--shape", "input_ids=1x16", "--no-compile-cache", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["precision"]["int8"]["per_channel"] is False
    note = next(n for n in report["notes"] if "per tensor, not per channel" in n)
    assert "(head)" in note and "--per-tensor" in note
    assert "head" in report["precision"]["coverage"]["quantized_nodes"]
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)


def test_dynamic_int8_of_a_cnn_reports_its_tiny_share_of_flops_and_warns(invoke, pretrained_cls, tmp_path):
    out = tmp_path / "cls.dyn.onnx"
    result = invoke("optimize", pretrained_cls, "-o", out, "-t", "cpu", *SHAPE, "--int8", "dynamic",
                    "--no-compile-cache", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    coverage = report["precision"]["coverage"]
    assert len(coverage["quantized_nodes"]) == 1 and coverage["compute_nodes"] > 50
    assert 0 < coverage["flops_share"] < 0.001 and 0 < coverage["weights_share"] < 0.05 and coverage["low"]
    assert any("of the FLOPs" in w and "--int8 static" in w for w in report["warnings"])
    text = invoke("optimize", pretrained_cls, "-o", tmp_path / "again.onnx", "-t", "cpu", *SHAPE, "--int8",
                  "dynamic", "--no-compile-cache")
    assert text.exit_code == 0 and "INT8 covers <0.01% of the FLOPs" in text.output.replace("\n", " ")
