"""`onnxaccel inspect`: what a model is made of, and with --target, where each node really runs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from onnxaccel import providers
from onnxaccel.cli.args_data import OutputArgs, RunnerArgs
from onnxaccel.cli.args_model import ShapeArgs, SourceArg, TargetArgs
from onnxaccel.cli.common import console, err_console, handle_errors, note, print_json, warn
from onnxaccel.cli.compose import Built, Group, composed, option
from onnxaccel.cli.tables import columns, new_table
from onnxaccel.errors import PlacementError

if TYPE_CHECKING:
    from onnxaccel.analysis.inspect import InspectResult

#: The order of the options in --help.
ORDER = "model target precision ep_option shape batch strict nodes all_nodes no_check as_json"


class NodesArgs(Group):
    """How many nodes to list: --nodes N (the N with the most FLOPs), --all-nodes."""

    PARAMS = (
        option("nodes", int, 10, "--nodes", "-n", help="Show the N nodes with the most FLOPs (0: none)."),
        option("all_nodes", bool, False, "--all-nodes", help="Show every node (and list them all in --json)."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        return v


def register(app: typer.Typer) -> None:
    """Add the ``inspect`` command to the application."""
    app.command("inspect", help="Show a model's inputs and outputs, op histogram, parameters, FLOPs/MACs per node "
                "and activation memory for the bound shapes. With --target: which provider got each node, the "
                "nodes that fell back to the CPU, partitions, Memcpy nodes and whether CUDA/HIP graphs can be "
                "used.")(inspect_command)


@handle_errors
@composed(
    SourceArg("An .onnx file or a built-in zoo:NAME."),
    TargetArgs(kind="maybe", help="Also compile for this target and report node placement (cpu, cuda[:ID], "
               "migraphx[:ID], rocm, tensorrt, auto; /PRECISION, ?KEY=VALUE)."),
    ShapeArgs(), RunnerArgs(check="Skip the ONNX checker."), NodesArgs(), OutputArgs(), order=ORDER,
)
def inspect_command(model, tgt, shapes, runner, shown, as_json) -> None:
    """Print a model's graph statistics and, with --target, where each node runs."""
    from onnxaccel.analysis.inspect import inspect_model  # onnx, the runtime: imported when the command runs

    nodes, all_nodes, strict = shown.nodes, shown.all_nodes, runner.strict
    result = inspect_model(model, tgt, shapes=shapes.shapes, batch=shapes.batch, check=runner.check)
    if as_json:
        print_json(result.to_dict(nodes=all_nodes or nodes > 0))
    else:
        _render(result, len(result.stats.nodes) if all_nodes else nodes)
    if strict and result.has_fallback:
        fallback = result.placement.placement.fallback
        error = PlacementError(
            f"--strict: {len(fallback)} node(s) fell back from {tgt.provider}: "
            + ", ".join(f"{n.name or '(unnamed)'} ({n.op_type})" for n in fallback[:8])
            + (" ..." if len(fallback) > 8 else ""),
            "Replace or remove the ops the provider lacks, or drop --strict to accept the fallback.",
        )
        if as_json:
            err_console.print(f"[bold red]error:[/] {escape(error.message)}")
            raise typer.Exit(error.exit_code)
        raise error


def _render(result: InspectResult, top: int) -> None:
    m, s = result.model, result.stats
    producer = f"{m.proto.producer_name} {m.proto.producer_version}".strip() or "unknown producer"
    opsets = ", ".join(f"{d} {v}" for d, v in m.opsets.items())
    console.print(f"[bold]{escape(m.source)}[/]: IR {m.ir_version}, opsets {escape(opsets)}, {escape(producer)}")
    io = columns(new_table("inputs and outputs"), ("", "name", "dtype", "declared shape", "bound shape"), numbers=())
    for spec in m.inputs:
        io.add_row("in", escape(spec.name), spec.dtype, escape(spec.shape_text()),
                   "x".join(map(str, m.input_shapes.get(spec.name, ()))))
    for spec in m.outputs:
        io.add_row("out", escape(spec.name), spec.dtype, escape(spec.shape_text()), "")
    console.print(io)
    console.print(f"{len(s.nodes)} nodes, {s.param_count:,} parameters ({_bytes(s.param_bytes)}), "
                  f"{_totals_text(s)}; activations: peak {_bytes(s.activation_peak_bytes)} live, "
                  f"{_bytes(s.activation_total_bytes)} if none were reused")
    if result.scaling is not None:
        _render_scaling(result)
    coverage = s.coverage
    if s.partial:
        inside = f"; {s.subgraph_nodes} node(s) inside If/Loop/Scan subgraphs" if s.subgraph_nodes else ""
        console.print(f"[yellow]partial FLOP count, {len(s.uncounted)} node(s) uncounted:[/] " + escape(", ".join(
            f"{op} x{count}" for op, count in s.uncounted_by_op().items()) + inside), highlight=False)
        console.print(f"  {escape(coverage.text())}; not counted: {escape(coverage.why())}", highlight=False)
    ops = columns(new_table("ops"), ("op", "count", "FLOPs", "% FLOPs"), numbers=("count", "FLOPs", "% FLOPs"))
    by_op, uncounted = s.flops_by_op(), s.uncounted_by_op()
    total = s.total_flops or 1
    for op, count in s.op_histogram.items():
        flops = by_op.get(op, 0)
        missing = uncounted.get(op, 0)
        shown = "?" if missing == count else ("≥ " if missing else "") + _flops(flops)
        share = f"{100 * flops / total:.1f}" if coverage.sufficient and missing < count else "?"
        ops.add_row(escape(op), str(count), shown, share)
    console.print(ops)
    if len(s.parameters) > 1:
        console.print("parameters by dtype: " + ", ".join(
            f"{k} {v.count:,} ({_bytes(v.bytes)})" for k, v in s.parameters.items()))
    if top > 0:
        table = columns(new_table(f"top {min(top, len(s.nodes))} nodes by FLOPs" if top < len(s.nodes) else "nodes"),
                        ("#", "node", "op", "output shape", "MACs", "FLOPs", "params"),
                        numbers=("#", "MACs", "FLOPs", "params"))
        for n in (s.top_nodes(top) if top < len(s.nodes) else s.nodes):
            shape = n.output_shapes[0] if n.output_shapes else None
            table.add_row(str(n.index), escape(n.name), n.op_type, "x".join(map(str, shape)) if shape else "?",
                          _flops(n.macs) if n.counted else "?", _flops(n.flops) if n.counted else "?",
                          f"{n.params:,}")
        console.print(table)
    for text in s.notes:
        note(text)
    for text in result.warnings:
        (warn if "fall" in text or "took" in text else note)(text)
    if result.placement is not None:
        _render_placement(result)


def _totals_text(s) -> str:
    """``1.44 GFLOPs = 717.23 MMACs per inference``; ``≥`` before each when the count is partial; no figure
    at all when it covers too few of the MAC ops to mean anything (the share is printed instead)."""
    coverage = s.coverage
    if not coverage.sufficient:
        return f"FLOPs not counted ({coverage.text()}: too few for a total)"
    at_least = "≥ " if s.partial else ""  # the totals leave out the uncounted nodes: lower bounds
    return f"{at_least}{_flops(s.total_flops)}FLOPs = {at_least}{_flops(s.total_macs)}MACs per inference"


def _render_scaling(result: InspectResult) -> None:
    """The example values the totals above are at, and the formulas in those dims that fit."""
    scaling = result.scaling
    console.print(f"[yellow]shapes {escape(scaling.label())}[/]", highlight=False)
    for name, metric in scaling.metrics.items():
        formula = metric.formula()
        console.print(f"  {name}: " + escape(formula if formula else
                                              "no simple formula in these dims (see --json samples)"),
                      highlight=False)


def _render_placement(result: InspectResult) -> None:
    report = result.placement
    p = report.placement
    console.print(f"\n[bold]placement on {escape(str(result.target))}[/] at {escape(result.shapes_text)} "
                  f"({', '.join(result.providers)}; session built in {result.compile_seconds * 1e3:.0f} ms): "
                  f"{escape(p.summary())}")
    table = columns(new_table(), ("provider", "nodes", "%"), numbers=("nodes", "%"))
    total = report.compute_nodes or 1
    for ep, count in report.per_provider().items():
        table.add_row(ep, str(count), f"{100 * count / total:.1f}")
    console.print(table)
    fallback = p.fallback if report.requested != providers.get("cpu").provider else ()
    if fallback:
        fb = columns(new_table(f"{len(fallback)} node(s) not on {report.requested}"), ("op", "node", "provider"),
                     numbers=())
        where = {n.name: ep for ep, nodes in p.nodes.items() for n in nodes}
        for n in fallback:
            fb.add_row(n.op_type, escape(n.name or "(unnamed)"), where.get(n.name, "?"))
        console.print(fb)
    breaks = f"{len(report.partitions)} partition(s), {report.graph_breaks} graph break(s)"
    if report.graph_source == "original-graph":
        breaks += " (estimated on the original graph)"
    console.print(f"{breaks}; {report.memcpy_nodes} Memcpy node(s)")
    for c in report.copies:
        console.print(f"  {c.op_type} {escape(c.name)}: '{escape(c.tensor)}' from {escape(str(c.producer))} to "
                      f"{escape(', '.join(c.consumers))}")
    gc = report.graph_capture
    if gc.possible is None:
        console.print(f"graph capture: not applicable ({escape(gc.reason)})")
    else:
        verdict = "[green]possible[/]" if gc.possible else "[red]not possible[/]"
        console.print(f"{gc.feature} ({gc.option}=1): {verdict}: {escape(gc.reason)}")
    for text in report.notes:
        note(text)


def _flops(value: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} "


def _bytes(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"
