"""Profiling on the CPU with real sessions; the parsers of external profilers on their documented formats; the
rocprofv3 command line parsed by the argument parser of each rocprofv3 release (tests/analysis/upstream/)."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import pytest
from typer.testing import CliRunner

from onnxaccel import load_model, parse_target
from onnxaccel.analysis.kernels import choose_tool, parse_kernel_stats
from onnxaccel.analysis.placement import optimized_graph
from onnxaccel.analysis.profile import PERTURBATION_NOTE, parse_profile, profile_model, profile_runner
from onnxaccel.cli.main import app
from onnxaccel.errors import UsageError
from onnxaccel.pipeline import prepare
from tests.analysis.upstream import rocprofv3 as upstream_rocprofv3


def test_profile_covers_every_node_that_runs_and_writes_a_chrome_trace(tmp_path):
    trace = tmp_path / "trace.json"
    prepared = prepare("zoo:squeezenet", parse_target("cpu"))
    parsed, events, notes = profile_runner(prepared.runner, prepared.feeds, runs=3, warmup=2, trace=trace)
    # One row per node of the graph ONNX Runtime runs: the model after its optimizations (NCHWc convolutions
    # and reorders on this CPU), which it writes out on request.
    graph, problem = optimized_graph(prepared.runner)
    assert graph is not None, problem
    assert len(parsed.nodes) == len(graph.node)
    assert Counter(n.op_type for n in parsed.nodes) == Counter(n.op_type for n in graph.node)
    named = {n.name for n in graph.node if n.name}  # ONNX Runtime calls unnamed nodes OpType_index
    assert named <= {n.name for n in parsed.nodes}
    assert all(n.calls == 3 for n in parsed.nodes)  # warm-up runs are left out of the tables
    assert len(parsed.runs_us) == 3
    assert sum(n.percent for n in parsed.nodes) == pytest.approx(100.0)
    assert sum(o.nodes for o in parsed.ops) == len(parsed.nodes)
    assert parsed.ops[0].op_type == "Conv"  # convolutions dominate a CNN
    assert PERTURBATION_NOTE in notes
    doc = json.loads(trace.read_text())
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] == "ms"
    for event in doc["traceEvents"]:
        assert {"name", "ph", "ts", "pid", "tid"} <= set(event)
        assert event["ph"] == "X" and event["dur"] >= 0
    node_events = [e for e in doc["traceEvents"] if e["cat"] == "Node"]
    assert len(node_events) == (2 + 3) * len(graph.node)  # the trace keeps the warm-up runs


def test_without_graph_optimizations_the_table_matches_the_model_node_for_node(mlp_path):
    target = parse_target("cpu?graph_optimization_level=disable")
    result = profile_model(str(mlp_path), target, runs=2, warmup=1)
    model_nodes = [n.name for n in load_model(mlp_path).proto.graph.node]
    assert sorted(n.name for n in result.profile.nodes) == sorted(model_nodes)
    assert {n.name: n.op_type for n in result.profile.nodes} == {"mm1": "MatMul", "relu": "Relu", "mm2": "MatMul",
                                                                 "softmax": "Softmax"}
    assert result.to_dict()["schema"] == "onnxaccel.profile/1"


def test_parser_skips_warmup_and_shows_fused_subgraphs():
    def node(name, op, ts, dur, ep="MIGraphXExecutionProvider"):
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "ph": "X",
                "args": {"op_name": op, "provider": ep}}

    def run(ts, dur):
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur, "ph": "X", "args": {}}

    fused, fused_op = "MIGraphXExecutionProvider_MGXKernel_graph_main_graph_1234_0_0", "MGXKernel_graph_main_1234_0"
    cpu = "CPUExecutionProvider"
    events = [
        node(fused, fused_op, 10, 900), node("nms", "NonMaxSuppression", 920, 50, cpu),
        run(5, 1000),  # warm-up
        node(fused, fused_op, 1010, 80), node("nms", "NonMaxSuppression", 1095, 20, cpu),
        run(1005, 120),
    ]
    parsed = parse_profile(events, skip_runs=1)
    assert parsed.runs_us == (120.0,)
    by_name = {n.name: n for n in parsed.nodes}
    assert by_name[fused].fused == "MIGraphX" and by_name[fused].total_us == 80
    assert by_name["nms"].fused is None and by_name["nms"].calls == 1
    assert [o.op_type for o in parsed.ops] == ["MIGraphX fused subgraph", "NonMaxSuppression"]
    assert parsed.ops[0].percent == pytest.approx(80.0)


def test_device_kernel_events_are_tabled():
    conv = {"op_name": "Conv"}  # CUPTI kernel events carry the node's op (microsoft/onnxruntime#8406)
    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 100, "ph": "X"},
        {"cat": "Node", "name": "conv_kernel_time", "ts": 1, "dur": 5, "ph": "X",
         "args": {"op_name": "Conv", "provider": "CUDAExecutionProvider"}},
        {"cat": "Kernel", "name": "implicit_convolve_sgemm", "ts": 2, "dur": 30, "ph": "X", "args": conv},
        {"cat": "Kernel", "name": "implicit_convolve_sgemm", "ts": 40, "dur": 10, "ph": "X", "args": conv},
    ]
    kernels = parse_profile(events).kernels
    assert [(k.name, k.calls, k.total_us, k.op_type) for k in kernels] == [("implicit_convolve_sgemm", 2, 40.0, "Conv")]


def test_profile_cli_json_and_table(tmp_path):
    runner = CliRunner()
    trace = tmp_path / "t.json"
    result = runner.invoke(app, ["profile", "zoo:squeezenet", "--target", "cpu", "--runs", "2", "--warmup", "1",
                                 "--trace", str(trace), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["node_count"] == len(data["nodes"]) > 10 and data["trace"] == str(trace)
    assert any("perturbs timing" in n for n in data["notes"])
    table = runner.invoke(app, ["profile", "zoo:squeezenet", "--target", "cpu", "--runs", "2", "--top", "3"])
    assert table.exit_code == 0
    assert "time per op type" in table.output and "top 3 nodes" in table.output
    assert "perturbs timing" in " ".join(table.output.split())


def test_profile_rejects_bad_counts():
    result = CliRunner().invoke(app, ["profile", "zoo:squeezenet", "--target", "cpu", "--runs", "0"])
    assert result.exit_code == 2 and "--runs" in result.output


# -- external kernel profilers: their CSV formats, and what happens when they are absent ---------------

ROCPROFV3_STATS = '''"Name","Calls","TotalDurationNs","AverageNs","Percentage","MinNs","MaxNs","StdDev"
"Cijk_Ailk_Bljk_HHS_BH_MT128x128x32","48","960000","20000.0","80.0","19000","21000","500.0"
"void migraphx::gpu::elementwise<...>","120","240000","2000.0","20.0","1900","2100","50.0"
'''
NSYS_KERN_SUM = '''Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
75.0,"3,000,000",100,30000.0,30000.0,29000,31000,500.0,sm90_xmma_gemm_f16f16_f32
25.0,1000000,400,2500.0,2500.0,2400,2600,40.0,"void elementwise_kernel<float>(int, float*)"
'''


def test_rocprofv3_stats_are_parsed_by_column_name():
    kernels = parse_kernel_stats(ROCPROFV3_STATS)
    assert [(k.calls, k.total_us) for k in kernels] == [(48, 960.0), (120, 240.0)]
    assert kernels[0].name.startswith("Cijk_") and kernels[0].percent == pytest.approx(80.0)
    assert kernels[0].mean_us == pytest.approx(20.0)


def test_nsys_kernel_summary_is_parsed_with_thousands_separators():
    kernels = parse_kernel_stats("Processing report...\n" + NSYS_KERN_SUM)
    assert [(k.name, k.calls, k.total_us) for k in kernels] == [
        ("sm90_xmma_gemm_f16f16_f32", 100, 3000.0), ("void elementwise_kernel<float>(int, float*)", 400, 1000.0)]


def test_kernel_profiler_must_be_on_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UsageError) as info:
        choose_tool("nsys", parse_target("cpu"))
    assert "not on PATH" in info.value.message and "nsys" in info.value.hint
    with pytest.raises(UsageError) as info:
        choose_tool("auto", parse_target("cpu"))
    assert "GPU target" in info.value.message
    with pytest.raises(UsageError):
        choose_tool("perf", parse_target("cpu"))


FAKE_NSYS = r'''#!/usr/bin/env bash
# Stand-in for Nsight Systems with its command-line shape: `profile ... -o OUT CMD...` runs CMD and writes
# OUT.nsys-rep; `stats ... --output PREFIX REPORT` writes PREFIX_cuda_gpu_kern_sum.csv.
set -e
if [ "$1" = profile ]; then
  shift
  while [ "$1" != "-o" ]; do shift; done
  out="$2"; shift 2
  "$@"
  echo report > "$out.nsys-rep"
elif [ "$1" = stats ]; then
  while [ "$1" != "--output" ]; do shift; done
  cat > "$2_cuda_gpu_kern_sum.csv" <<'CSV'
Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
100.0,300000,30,10000.0,10000.0,9000,11000,100.0,gemm_kernel
CSV
fi
'''


def test_kernel_profile_runs_the_workload_under_the_tool(tmp_path, monkeypatch):
    from onnxaccel.analysis.kernels import run_kernel_profile

    tool = tmp_path / "nsys"
    tool.write_text(FAKE_NSYS)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert choose_tool("auto", parse_target("cuda")) == "nsys"
    # The workload itself is real: it prepares and runs the model (here on the CPU) under the tool.
    report = run_kernel_profile("nsys", "zoo:squeezenet", parse_target("cpu"), runs=2, warmup=1)
    assert report.command[:3] == ["nsys", "profile", "--trace=cuda"]
    assert [(k.name, k.calls) for k in report.kernels] == [("gemm_kernel", 30)]
    assert report.to_dict()["kernel_ms_per_run"] == pytest.approx(0.3 / 3)


# -- rocprofv3's command line, parsed by the argument parser of each release (vendored excerpts) -----------


RELEASES = {path.stem: path for path in upstream_rocprofv3.EXCERPTS}


def test_the_vendored_rocprofv3_parsers_cover_rocm_6_2_6_3_and_7():
    assert set(RELEASES) == {"rocprofv3_rocm-6.2.0", "rocprofv3_0.5.0_rocm-6.3", "rocprofv3_1.0.0_rocm-7.0"}
    for path in RELEASES.values():
        source = upstream_rocprofv3.source_of(path)
        assert "rocprofv3.py @ " in source and len(source.split("@ ")[1].split()[0]) == 40, source


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_rocprofv3_command_line_is_accepted_by_every_release(release, tmp_path):
    from onnxaccel.analysis.kernels import profiler_command

    workload = ["/usr/bin/python3", "-m", "onnxaccel.analysis.kernels", '{"runs": 2}']
    command = profiler_command("rocprofv3", tmp_path, workload)
    assert command[0] == "rocprofv3"
    options, app = upstream_rocprofv3.parse(RELEASES[release], command[1:])
    assert options.output_format == ["csv"]  # ROCm 7.0 would write rocpd (SQLite) without it
    assert options.kernel_trace is True and options.stats is True
    assert (options.output_directory, options.output_file) == (str(tmp_path), "onnxaccel")
    assert app == workload


@pytest.mark.parametrize("release, accepted", [("rocprofv3_rocm-6.2.0", False), ("rocprofv3_0.5.0_rocm-6.3", False),
                                               ("rocprofv3_1.0.0_rocm-7.0", True)])
def test_the_short_f_spelling_exists_only_from_rocm_7(release, accepted, capsys):
    """The spelling the tool used before (`-f csv`): ROCm 6.2/6.3's parsers exit 2 on it."""
    argv = ["--kernel-trace", "--stats", "-d", "out", "-o", "onnxaccel", "-f", "csv", "--", "app"]
    if accepted:
        assert upstream_rocprofv3.parse(RELEASES[release], argv)[0].output_format == ["csv"]
        return
    with pytest.raises(SystemExit) as info:
        upstream_rocprofv3.parse(RELEASES[release], argv)
    assert info.value.code == 2 and "unrecognized arguments: -f csv" in capsys.readouterr().err


@pytest.mark.parametrize("release", ["rocprofv3_rocm-6.2.0", "rocprofv3_0.5.0_rocm-6.3"])
def test_kernel_profile_runs_under_a_rocm_6_rocprofv3(release, tmp_path, monkeypatch):
    """The whole path: run_kernel_profile calls a `rocprofv3` on PATH whose option parsing is ROCm 6.x's own;
    it runs the real workload and writes kernel statistics where rocprofv3 does."""
    from onnxaccel.analysis.kernels import run_kernel_profile

    tool = tmp_path / "bin" / "rocprofv3"
    tool.parent.mkdir()
    tool.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{upstream_rocprofv3.__file__}' '{RELEASES[release]}' \"$@\"\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    assert choose_tool("auto", parse_target("migraphx")) == "rocprofv3"
    report = run_kernel_profile("rocprofv3", "zoo:squeezenet", parse_target("cpu"), runs=1, warmup=0)
    assert report.command[report.command.index("--output-format") + 1] == "csv" and "-f" not in report.command
    assert [(k.name, k.calls, k.total_us) for k in report.kernels] == [("Cijk_Ailk_Bljk_SB_MT64x64x8", 12, 240.0)]
