"""Placement: real sessions where the machine allows it, constructed placements only for pure logic."""

from __future__ import annotations

import json

import onnx
import pytest
from typer.testing import CliRunner

from onnxaccel import load_model, parse_target
from onnxaccel.analysis.placement import (
    Copy, analyze_placement, find_partitions, graph_capture_verdict, optimized_graph,
)
from onnxaccel.cli.main import app
from onnxaccel.engines.base import PlacedNode, Placement
from onnxaccel.errors import PlacementError
from onnxaccel.pipeline import prepare

CUDA, CPU, TRT = "CUDAExecutionProvider", "CPUExecutionProvider", "TensorrtExecutionProvider"


def _placement(requested: str, **by_ep: list[tuple[str, str]]) -> Placement:
    names = {"cuda": CUDA, "cpu": CPU, "trt": TRT}
    return Placement(requested, {names[k]: tuple(PlacedNode(op, name) for op, name in v) for k, v in by_ep.items()},
                     "assignment-info")


# -- real sessions ---------------------------------------------------------------------------------------

def test_cpu_target_reports_one_partition_and_no_capture():
    prepared = prepare("zoo:bert-tiny", parse_target("cpu"))
    report = analyze_placement(prepared.runner)
    assert report.placement.method == "assignment-info"
    assert report.per_provider() == {CPU: report.placement.total}
    assert len(report.partitions) == 1 and report.graph_breaks == 0
    assert report.memcpy_nodes == 0
    assert report.graph_capture.possible is None and "GPU feature" in report.graph_capture.reason


def test_fallback_is_found_by_the_real_partitioner(mlp_path, azure_as_cuda):
    prepared = prepare(str(mlp_path), parse_target("cuda"))
    report = analyze_placement(prepared.runner)
    placement = report.placement
    assert placement.requested == azure_as_cuda
    assert [(n.op_type, n.name) for n in placement.fallback] == [
        ("MatMul", "mm1"), ("Relu", "relu"), ("MatMul", "mm2"), ("Softmax", "softmax")]
    assert placement.summary() == "Azure took 0/4 nodes; 4 on CPU: MatMul x2, Relu x1, Softmax x1"
    assert report.to_dict()["fallback_ops"] == {"MatMul": 2, "Relu": 1, "Softmax": 1}
    assert any("took 0/4" in w for w in prepared.warnings)


def test_strict_refuses_the_fallback(mlp_path, azure_as_cuda):
    with pytest.raises(PlacementError) as info:
        prepare(str(mlp_path), parse_target("cuda"), strict=True)
    assert "MatMul x2" in info.value.message and "inspect" in info.value.hint


def test_inspect_strict_exit_status_and_names_nodes(mlp_path, azure_as_cuda):
    runner = CliRunner()
    strict = runner.invoke(app, ["inspect", str(mlp_path), "--target", "cuda", "--strict", "-n", "0"])
    assert strict.exit_code == 1
    text = " ".join(strict.output.split())  # Rich wraps at the test terminal's 80 columns
    assert "mm1 (MatMul)" in text and "softmax (Softmax)" in text
    relaxed = runner.invoke(app, ["inspect", str(mlp_path), "--target", "cuda", "--json", "-n", "0"])
    assert relaxed.exit_code == 0
    data = json.loads(relaxed.output)
    assert data["schema"] == "onnxaccel.inspect/1"
    assert [n["name"] for n in data["placement"]["fallback"]] == ["mm1", "relu", "mm2", "softmax"]


def test_inspect_strict_passes_without_fallback(mlp_path):
    result = CliRunner().invoke(app, ["inspect", str(mlp_path), "--target", "cpu", "--strict"])
    assert result.exit_code == 0, result.output
    assert "CPU took 4/4 nodes" in " ".join(result.output.split())


def test_optimized_graph_is_the_graph_that_runs():
    prepared = prepare("zoo:bert-tiny", parse_target("cpu"))
    graph, problem = optimized_graph(prepared.runner)
    assert graph is not None, problem
    ops = {n.op_type for n in graph.node}
    # Fusions that run after partitioning appear only here, not in the placement.
    assert {"FusedMatMul", "BiasGelu"} <= ops
    placed = {n.name for nodes in prepared.runner.placement.nodes.values() for n in nodes}
    assert not {"FusedMatMul", "BiasGelu"} & {n.op_type for ns in prepared.runner.placement.nodes.values()
                                               for n in ns}
    assert len(placed & {n.name for n in graph.node}) > len(graph.node) // 2
    # The fused nodes take their neighbours' provider: one partition covers the whole graph.
    parts = find_partitions(graph, prepared.runner.placement)
    assert [(p.provider, p.nodes) for p in parts] == [(CPU, len(graph.node))]


# -- pure logic on constructed placements ----------------------------------------------------------------

def test_partitions_count_islands_and_breaks(mlp_path):
    graph = onnx.load(str(mlp_path)).graph  # mm1 -> relu -> mm2 -> softmax
    placement = _placement(CUDA, cuda=[("MatMul", "mm1"), ("Relu", "relu"), ("Softmax", "softmax")],
                           cpu=[("MatMul", "mm2")])
    parts = find_partitions(graph, placement)
    assert [(p.provider, p.nodes, p.first) for p in parts] == [
        (CUDA, 2, "mm1"), (CPU, 1, "mm2"), (CUDA, 1, "softmax")]


def test_one_cpu_node_with_memcpy_blocks_cuda_graphs_and_is_named():
    # What a CUDA GPU showed for BERT: one node on the CPU, a Memcpy on each side of it.
    placement = _placement(CUDA, cuda=[("MatMul", "qkv"), ("MemcpyToHost", "Memcpy"),
                                       ("MemcpyFromHost", "Memcpy_1"), ("Softmax", "sm")],
                           cpu=[("Range", "/embeddings/Range")])
    copies = (Copy("Memcpy", "MemcpyToHost", "t0", "qkv", ("/embeddings/Range",)),
              Copy("Memcpy_1", "MemcpyFromHost", "t1", "/embeddings/Range", ("sm",)))
    verdict = graph_capture_verdict(placement, memcpy=2, copies=copies)
    assert verdict.possible is False and verdict.option == "enable_cuda_graph"
    assert [n.name for n in verdict.blocking] == ["/embeddings/Range"]
    assert "2 Memcpy node(s)" in verdict.reason and "/embeddings/Range (Range)" in verdict.reason
    assert placement.summary() == ("CUDA took 2/3 nodes; 1 on CPU: Range x1; 2 Memcpy node(s) inserted")


def test_cpu_shape_nodes_without_copies_allow_cuda_graphs():
    placement = _placement(CUDA, cuda=[("Conv", "c")], cpu=[("Shape", "s"), ("Gather", "g")])
    verdict = graph_capture_verdict(placement, memcpy=0)
    assert verdict.possible is True and "shape node(s)" in verdict.reason


def test_all_on_cuda_allows_cuda_graphs():
    verdict = graph_capture_verdict(_placement(CUDA, cuda=[("Conv", "c"), ("Relu", "r")]), memcpy=0)
    assert verdict.possible is True and verdict.feature == "CUDA graph"


def test_control_flow_blocks_graph_capture():
    placement = _placement(CUDA, cuda=[("If", "branch"), ("Relu", "r")])
    verdict = graph_capture_verdict(placement, memcpy=0, control_flow=(PlacedNode("If", "branch"),))
    assert verdict.possible is False and "control-flow" in verdict.reason


def test_tensorrt_needs_every_node():
    placement = _placement(TRT, trt=[("TRTKernel_graph_main_0", "TRTKernel_0")], cuda=[("NonZero", "nz")])
    verdict = graph_capture_verdict(placement, memcpy=0)
    assert verdict.possible is False and verdict.option == "trt_cuda_graph_enable" and "nz (NonZero)" in verdict.reason


def test_migraphx_and_cpu_have_no_graph_capture():
    migraphx = graph_capture_verdict(Placement("MIGraphXExecutionProvider", {}, "assignment-info"), memcpy=0)
    assert migraphx.possible is None and "MIGraphX" in migraphx.reason
    cpu = graph_capture_verdict(_placement(CPU, cpu=[("Relu", "r")]), memcpy=0)
    assert cpu.possible is None


def test_nothing_on_the_gpu_is_not_capturable():
    verdict = graph_capture_verdict(_placement(CUDA, cpu=[("Relu", "r")]), memcpy=0)
    assert verdict.possible is False and "no node runs on CUDA" in verdict.reason


def test_inspect_cli_without_target_shows_flops(mlp_path):
    result = CliRunner().invoke(app, ["inspect", str(mlp_path), "--batch", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["graph"]["total_macs"] == 112 and data["placement"] is None
    assert len(data["graph"]["nodes"]) == 4


def test_inspect_unknown_target_is_a_usage_error_with_a_hint(mlp_path):
    result = CliRunner().invoke(app, ["inspect", str(mlp_path), "--target", "cdua"])
    assert result.exit_code == 2
    assert "Did you mean 'cuda'" in " ".join(result.output.split())


def test_loaded_model_is_not_needed_for_constructed_placements():
    # find_partitions works on any graph whose node names match; unknown names are skipped.
    graph = load_model("zoo:squeezenet").proto.graph
    placement = Placement(CUDA, {CUDA: tuple(PlacedNode(n.op_type, n.name) for n in graph.node)}, "assignment-info")
    parts = find_partitions(graph, placement)
    assert len(parts) == 1 and parts[0].nodes == len(graph.node)


def test_inspect_with_graph_capture_on_still_shows_the_placement(mlp_path, azure_as_cuda):
    # ORT refuses to build a session it cannot capture; inspect analyzes without the switch instead.
    from onnxaccel.analysis.inspect import inspect_model

    result = inspect_model(str(mlp_path), parse_target("cuda?enable_cuda_graph=1"))
    assert result.placement.placement.requested == azure_as_cuda
    assert len(result.placement.placement.fallback) == 4
    assert any("without enable_cuda_graph" in w for w in result.warnings)
    assert str(result.target) == "cuda?enable_cuda_graph=1"
