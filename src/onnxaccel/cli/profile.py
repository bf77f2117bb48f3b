"""`onnxaccel profile`: where the time goes, per op type and per node, from ONNX Runtime's profiler."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from onnxaccel.analysis.kernels import choose_tool, run_kernel_profile
from onnxaccel.analysis.profile import ProfileResult, profile_model
from onnxaccel.cli.common import (
    BatchOpt, EpOptionOpt, JsonOpt, PrecisionOpt, ShapeOpt, StrictOpt, TargetOpt, ValueRangeOpt, console, handle_errors, note,
    print_json, resolve_target, warn,
)
from onnxaccel.cli.tables import columns, new_table, number_column, text_column
from onnxaccel.errors import UsageError
from onnxaccel.inputs import parse_value_ranges
from onnxaccel.model import parse_shape_bindings


def register(app: typer.Typer) -> None:
    """Add the ``profile`` command to the application."""
    app.command("profile", help="Profile a model with ONNX Runtime's profiler: time per op type and per node "
                "(total, mean, %, calls, provider), hotspots, fused MIGraphX/TensorRT subgraphs; writes the "
                "Chrome trace with --trace. With --kernels, also runs the workload under rocprofv3/rocprof "
                "(AMD) or nsys (NVIDIA) and summarizes GPU kernel time.")(profile_command)


@handle_errors
def profile_command(
    model: Annotated[str, typer.Argument(help="An .onnx file or a built-in zoo:NAME.")],
    target: TargetOpt = "auto",
    precision: PrecisionOpt = None,
    ep_option: EpOptionOpt = None,
    shape: ShapeOpt = None,
    batch: BatchOpt = None,
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE (.npy, .npz, .pb, image) or "
                      "NAME=VALUE; inputs not given are synthesized.")] = None,
    runs: Annotated[int, typer.Option(help="Profiled runs.")] = 20,
    warmup: Annotated[int, typer.Option(help="Runs before profiling counts (left out of the tables, kept in "
                      "the trace).")] = 3,
    trace: Annotated[Path | None, typer.Option("--trace", help="Write the Chrome trace (chrome://tracing, "
                     "Perfetto) to this JSON file.")] = None,
    top: Annotated[int, typer.Option("--top", help="Rows in the per-node hotspot table.")] = 15,
    kernels: Annotated[str | None, typer.Option("--kernels", help="Also profile GPU kernels with auto, rocprofv3, "
                       "rocprof or nsys (must be on PATH).")] = None,
    value_range: ValueRangeOpt = None,
    strict: StrictOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Profile a model with ONNX Runtime's profiler (or an external kernel profiler) and print the hotspots."""
    if top < 1:
        raise UsageError(f"--top must be at least 1, got {top}.", "e.g. --top 10")
    tgt = resolve_target(target, precision, ep_option)
    shapes = parse_shape_bindings(shape or [])
    result = profile_model(model, tgt, runs=runs, warmup=warmup, trace=trace, inputs=inputs or [], shapes=shapes,
                           batch=batch, strict=strict, value_ranges=parse_value_ranges(value_range))
    if kernels:
        tool = choose_tool(kernels, tgt)
        report = run_kernel_profile(tool, model, tgt, runs=runs, warmup=warmup, inputs=inputs or [], shapes=shapes,
                                    batch=batch)
        result.external = report.to_dict()
    if as_json:
        print_json(result.to_dict())
        return
    _render(result, top)


def _render(result: ProfileResult, top: int) -> None:
    d = result.to_dict()
    shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in result.input_shapes.items())
    console.print(f"[bold]{escape(result.model)}[/] on [bold]{escape(result.target)}[/] ({result.providers[0]}); "
                  f"inputs {escape(shapes)}; {result.runs} profiled runs after {result.warmup} warm-up")
    console.print(f"profiled run: mean {d['run_ms']['mean']:.3f} ms (min {d['run_ms']['min']:.3f}, max "
                  f"{d['run_ms']['max']:.3f}); node time {d['node_total_ms_per_run']:.3f} ms per run over "
                  f"{result.node_count} nodes")
    ops = columns(new_table("time per op type"), ("op", "provider", "nodes", "calls", "total ms", "mean us", "%"),
                  numbers=("nodes", "calls", "total ms", "mean us", "%"))
    for o in result.profile.ops:
        ops.add_row(escape(o.op_type), _short(o.provider), str(o.nodes), str(o.calls), f"{o.total_us / 1e3:.3f}",
                    f"{o.mean_us:.1f}", f"{o.percent:.1f}")
    console.print(ops)
    hot = columns(new_table(f"top {min(top, result.node_count)} nodes"),
                  ("node", "op", "provider", "calls", "total ms", "mean us", "%"),
                  numbers=("calls", "total ms", "mean us", "%"))
    for n in result.hotspots(top):
        label = f"{escape(n.name)} [magenta](fused {n.fused} subgraph)[/]" if n.fused else escape(n.name)
        hot.add_row(label, escape(n.op_type), _short(n.provider), str(n.calls), f"{n.total_us / 1e3:.3f}",
                    f"{n.mean_us:.1f}", f"{n.percent:.1f}")
    console.print(hot)
    if result.profile.kernels:
        _kernel_table("GPU kernels (ONNX Runtime's device profiler)", [k.to_dict() for k in result.profile.kernels],
                      top)
    if result.external:
        ext = result.external
        _kernel_table(f"GPU kernels ({ext['tool']}; {ext['kernel_ms_per_run']:.3f} ms and "
                      f"{ext['kernel_launches_per_run']:.0f} launches per run, warm-up and setup included)",
                      ext["kernels"], top)
    if result.trace:
        console.print(f"Chrome trace written to {escape(result.trace)} (open in chrome://tracing or Perfetto)")
    for text in result.notes:
        (warn if "perturbs" in text or "fall" in text else note)(text)


def _kernel_table(title: str, rows: list[dict], top: int) -> None:
    table = new_table(title)
    text_column(table, "kernel", max_width=70)
    for col in ("calls", "total ms", "mean us", "%"):
        number_column(table, col)
    for k in rows[:top]:
        table.add_row(escape(k["name"]), str(k["calls"]), f"{k['total_us'] / 1e3:.3f}", f"{k['mean_us']:.1f}",
                      f"{k['percent']:.1f}")
    console.print(table)


def _short(provider: str) -> str:
    return provider.replace("ExecutionProvider", "")
