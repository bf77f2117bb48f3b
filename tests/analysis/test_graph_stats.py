"""FLOPs, parameters and activation memory, checked against counts made by hand and published figures."""

from __future__ import annotations

import pytest

from onnxaccel import load_model
from onnxaccel.analysis.graph_stats import graph_stats, model_flops


def test_mlp_counts_equal_the_hand_count(mlp_path):
    stats = graph_stats(load_model(mlp_path).bind(batch=2))
    # MatMul 2x4 @ 4x8 = 64 MACs, MatMul 2x8 @ 8x3 = 48 MACs; Relu 16 elements; Softmax 3 FLOPs x 6 elements.
    assert stats.total_macs == 64 + 48
    assert stats.total_flops == 2 * (64 + 48) + 16 + 3 * 6
    assert [n.macs for n in stats.nodes] == [64, 0, 48, 0]
    assert stats.param_count == 4 * 8 + 8 * 3
    assert stats.parameters["float"].bytes == 4 * (4 * 8 + 8 * 3)
    assert stats.op_histogram == {"MatMul": 2, "Relu": 1, "Softmax": 1}


def test_mlp_activation_memory_follows_liveness(mlp_path):
    stats = graph_stats(load_model(mlp_path).bind(batch=2))
    # float32 tensors: x 2x4 (32 B), h and r 2x8 (64 B each), logits and probs 2x3 (24 B each).
    # Peak: r is created while h is still alive (x is freed after mm1): 64 + 64 = 128 B.
    assert stats.activation_peak_bytes == 128
    assert stats.activation_total_bytes == 64 + 64 + 24 + 24
    assert stats.largest_activation[1] == 64


def test_grouped_strided_conv_with_bias_is_exact(conv_path):
    stats = graph_stats(load_model(conv_path).bind())
    # Output 1x8x5x5 = 200 elements; each sums Cin/group * k*k = 2 * 9 = 18 products; bias adds 200.
    assert stats.total_macs == 200 * 18
    assert stats.total_flops == 2 * 200 * 18 + 200
    assert stats.param_count == 8 * 2 * 3 * 3 + 8


def test_model_flops_is_the_total(mlp_path):
    model = load_model(mlp_path).bind(batch=3)
    assert model_flops(model) == graph_stats(model).total_flops == 2 * (3 * 4 * 8 + 3 * 8 * 3) + 3 * 8 + 3 * 9


def test_resnet50_is_the_published_4_1_gmacs():
    stats = graph_stats(load_model("zoo:resnet50").bind(batch=1))
    # He et al. / torchvision: 4.09 GMACs (8.18 GFLOPs at 2 FLOPs per MAC), 25.6 M parameters.
    assert stats.total_macs == pytest.approx(4.09e9, rel=0.02)
    assert stats.total_flops == pytest.approx(8.2e9, rel=0.02)
    assert stats.param_count == pytest.approx(25.6e6, rel=0.01)
    assert not stats.uncounted
    assert stats.flops_by_op()["Conv"] / stats.total_flops > 0.95


def test_bert_tiny_matmul_macs_equal_the_transformer_formula():
    model = load_model("zoo:bert-tiny").bind(batch=1)
    seq = model.input_shapes["input_ids"][1]
    stats = graph_stats(model)
    hidden, inter, layers = 128, 512, 2  # BERT-tiny (google/bert_uncased_L-2_H-128_A-2)
    per_layer = 4 * seq * hidden * hidden + 2 * seq * seq * hidden + 2 * seq * hidden * inter
    pooler = hidden * hidden
    assert stats.total_macs == layers * per_layer + pooler
    assert not stats.uncounted  # shape inference resolved the Shape -> Slice chain of the embeddings


def test_flops_scale_with_the_bound_batch():
    one = model_flops(load_model("zoo:bert-tiny").bind(batch=1))
    four = model_flops(load_model("zoo:bert-tiny").bind(batch=4))
    assert four == 4 * one


def test_pretrained_detector_is_counted_at_any_bound_size(pretrained_det):
    small = graph_stats(load_model(pretrained_det).bind({"x": (1, 3, 96, 96)}))
    large = graph_stats(load_model(pretrained_det).bind({"x": (1, 3, 192, 192)}))
    assert not small.uncounted and not large.uncounted
    # A fully convolutional network: 4x the pixels, 4x the MACs.
    assert large.total_macs == pytest.approx(4 * small.total_macs, rel=0.01)
    assert small.param_count == large.param_count > 1e6
