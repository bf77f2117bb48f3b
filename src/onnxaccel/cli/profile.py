"""`onnxaccel profile`: where the time goes, per op type and per node, from ONNX Runtime's profiler."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from onnxaccel.cli.args_data import InputArgs, OutputArgs, RunnerArgs
from onnxaccel.cli.args_model import ShapeArgs, SourceArg, TargetArgs
from onnxaccel.cli.common import console, handle_errors, note, print_json, warn
from onnxaccel.cli.compose import Built, Group, composed, option
from onnxaccel.cli.tables import columns, new_table, number_column, text_column
from onnxaccel.errors import UsageError

if TYPE_CHECKING:
    from onnxaccel.analysis.profile import ProfileResult

#: The order of the options in --help.
ORDER = "model target precision ep_option shape batch inputs runs warmup trace top kernels value_range strict as_json"


class ProfileArgs(Group):
    """What the profiler runs and writes: --runs, --warmup, --trace, --top (checked), --kernels."""

    PARAMS = (
        option("runs", int, 20, help="Profiled runs."),
        option("warmup", int, 3, help="Runs before profiling counts (left out of the tables, kept in the trace)."),
        option("trace", Path | None, None, "--trace", help="Write the Chrome trace (chrome://tracing, Perfetto) to "
               "this JSON file."),
        option("top", int, 15, "--top", help="Rows in the per-node hotspot table."),
        option("kernels", str | None, None, "--kernels", help="Also profile GPU kernels with auto, rocprofv3, "
               "rocprof or nsys (must be on PATH)."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        if v.top < 1:
            raise UsageError(f"--top must be at least 1, got {v.top}.", "e.g. --top 10")
        return v


def register(app: typer.Typer) -> None:
    """Add the ``profile`` command to the application."""
    app.command("profile", help="Profile a model with ONNX Runtime's profiler: time per op type and per node "
                "(total, mean, %, calls, provider), hotspots, fused MIGraphX/TensorRT subgraphs; writes the "
                "Chrome trace with --trace. With --kernels, also runs the workload under rocprofv3/rocprof "
                "(AMD) or nsys (NVIDIA) and summarizes GPU kernel time.")(profile_command)


@handle_errors
@composed(
    ProfileArgs(), SourceArg("An .onnx file or a built-in zoo:NAME."), TargetArgs(), ShapeArgs(),
    InputArgs("NAME=FILE (.npy, .npz, .pb, image) or NAME=VALUE; inputs not given are synthesized.", seed=False),
    RunnerArgs(), OutputArgs(), order=ORDER,
)
def profile_command(how, model, tgt, bound, given, runner, as_json) -> None:
    """Profile a model with ONNX Runtime's profiler (or an external kernel profiler) and print the hotspots."""
    from onnxaccel.analysis.kernels import choose_tool, run_kernel_profile  # imported when the command runs
    from onnxaccel.analysis.profile import profile_model

    inputs, shapes, batch, runs, warmup = list(given.items), bound.shapes, bound.batch, how.runs, how.warmup
    result = profile_model(model, tgt, runs=runs, warmup=warmup, trace=how.trace, inputs=inputs, shapes=shapes,
                           batch=batch, strict=runner.strict, value_ranges=given.value_ranges)
    if how.kernels:
        tool = choose_tool(how.kernels, tgt)
        report = run_kernel_profile(tool, model, tgt, runs=runs, warmup=warmup, inputs=inputs, shapes=shapes,
                                    batch=batch)
        result.external = report.to_dict()
    if as_json:
        print_json(result.to_dict())
        return
    _render(result, how.top)


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
