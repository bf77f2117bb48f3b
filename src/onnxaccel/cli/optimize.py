"""`onnxaccel optimize`: write a faster model and a report of what changed and how accurate it still is.

This command composes ``transform`` (the model rewrites) with ``analysis`` (locating the first diverging
node, for AMP): DESIGN.md keeps features from importing one another, so the composition lives here and hands
``analysis.bisect.find_divergence`` to ``transform.optimize.optimize``. Comparing outputs is
:mod:`onnxaccel.compare`'s, beneath both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.panel import Panel

from onnxaccel.cli.args_data import OPTIMIZE_IMAGE_HELP, OutputArgs, PreprocessArgs, RunnerArgs
from onnxaccel.cli.args_model import ShapeArgs, SourceArg, TargetArgs
from onnxaccel.cli.args_optimize import INT8_MIN_COSINE, ConversionArgs, GateArgs, GraphArgs, WriteArgs, default_gate
from onnxaccel.cli.common import console, err_console, handle_errors, note, print_json
from onnxaccel.cli.compose import composed
from onnxaccel.cli.tables import columns, new_table
from onnxaccel.errors import UsageError

__all__ = ["INT8_MIN_COSINE", "default_gate", "node_flops", "optimize_command", "refuse_existing_output", "register",
           "render"]

#: The order of the options in --help.
ORDER = ("model output target ep_option shape batch fix_shape opset ir_version simplify graph_level "
         "transformer_fusions model_type fp16 amp fp16_block_op keep_fp32 int8 calibration calibration_samples "
         "calibration_method percentile per_channel int8_activations int8_exclude native table_format eval_data "
         "eval_samples atol rtol max_error min_topk_agreement topk min_cosine preprocess mean std resize layout bgr "
         "seed embed_preprocess compile_cache force no_check report_path as_json")


def register(app: typer.Typer) -> None:
    """Add the ``optimize`` command to the application."""
    app.command("optimize", help="Write an optimized model (graph optimization, simplification, fixed shapes, "
                "FP16 with automatic mixed precision, INT8 with calibration) and a report: nodes before/after, "
                "size, precision, accuracy against the original, first-compile and warm-start times. Exits 1 "
                "when the accuracy gate fails (the report is still written).")(optimize_command)


@handle_errors
@composed(
    SourceArg("An .onnx file or zoo:NAME. It is never modified."), WriteArgs(),
    # -o is the output here, as in most converters: --ep-option has no short flag anywhere.
    TargetArgs(precision=None, ep_option="Provider or session option KEY=VALUE for the target; repeatable."),
    ShapeArgs(), GraphArgs(), ConversionArgs(), GateArgs(),
    PreprocessArgs(image=OPTIMIZE_IMAGE_HELP, embed=(
        "Put preprocessing into the graph: the image input then takes uint8 NHWC pixels and the model does cast, "
        "scale, mean/std and the transpose (imagenet: /255 and ImageNet mean/std; yolo, scale01: /255). "
        "Resize/crop/letterbox stay outside. Checked equal to host preprocessing.", None)),
    RunnerArgs(strict=False, check="Skip the ONNX checker on the input."), OutputArgs(), order=ORDER,
)
def optimize_command(model, write, target, shapes, graph, conversion, checks, preprocess, runner, as_json) -> None:
    """Write an optimized copy of a model and print what changed."""
    from onnxaccel.analysis.bisect import find_divergence  # heavy: loaded per command
    from onnxaccel.transform.optimize import OptimizeOptions, optimize

    options = OptimizeOptions(
        output=write.output, target=target.with_precision("fp32"), force=write.force, check=runner.check,
        shapes=shapes.shapes, batch=shapes.batch, fix_shape=graph.fix_shape, opset=graph.opset,
        ir_version=graph.ir_version, simplify=graph.simplify, graph_level=graph.graph_level,
        transformer_fusions=graph.transformer_fusions, model_type=graph.model_type, fp16=conversion.fp16,
        amp=conversion.amp, fp16_block_ops=tuple(conversion.fp16_block_op or ()),
        keep_fp32_nodes=tuple(conversion.keep_fp32 or ()), int8=conversion.int8, calibration=conversion.calibration,
        calibration_samples=conversion.calibration_samples, preprocess=preprocess.request, native=conversion.native,
        native_table_format=conversion.table_format, eval_data=checks.eval_data, eval_samples=checks.eval_samples,
        seed=checks.seed, gate=checks.gate, graph_gate=checks.graph_gate, compile_cache=checks.compile_cache,
        embed_preprocess=preprocess.embed.lower() if preprocess.embed else None,
    )
    refuse_existing_output(model, write.output, write.force)
    with err_console.status("optimizing...", spinner="dots") if not as_json else _nothing():
        report = optimize(model, options, find_divergence, count_flops=node_flops)
    data = report.to_dict()
    if write.report_path is not None:
        write.report_path.parent.mkdir(parents=True, exist_ok=True)
        write.report_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    if as_json:
        print_json(data)
    else:
        render(report, write.report_path)
    if not report.passed:
        raise typer.Exit(1)


def node_flops(model) -> dict[str, int]:
    """FLOPs per node of a bound model (``analysis.graph_stats``), for INT8's share of the FLOPs in the report."""
    from onnxaccel.analysis.graph_stats import graph_stats

    return {node.name: node.flops for node in graph_stats(model).nodes}


def refuse_existing_output(model: str, output: Path, force: bool) -> None:
    """Refuse to replace an existing --output without --force, as --force's help says (an earlier output is
    never overwritten silently). The input itself and files another tool wrote are left to
    ``check_output_path``, whose messages say that the original would be lost / who did not write it."""
    from onnxaccel.transform.files import written_by_us

    output = Path(output).expanduser()
    if force or not output.is_file() or not written_by_us(output):
        return
    source = Path(model).expanduser()
    if source.exists() and os.path.samefile(output, source):
        return
    raise UsageError(f"--output {output} already exists.",
                     f"Pass --force to overwrite it, or choose another --output (e.g. "
                     f"{output.with_name(output.stem + '.new.onnx')}).")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def render(report, report_path: Path | None) -> None:
    """Print the optimization report: warnings first (synthetic calibration in red), then the changes."""
    for message in report.warnings:
        err_console.print(Panel(escape(message), title="warning", border_style="bold red" if "SYNTHETIC" in message
                                else "yellow"))
    for message in report.notes:
        note(message)
    before, after = report.before, report.after
    console.print(f"[bold]{escape(report.source)}[/] -> [bold]{escape(report.output)}[/] for {escape(report.target)}")
    sizes = columns(new_table("model"), ("", "nodes", "size", "precision", "opset", "IR"),
                    numbers=("nodes", "size", "opset", "IR"))
    for label, summary in (("before", before), ("after", after)):
        if summary is not None:
            sizes.add_row(label, str(summary.nodes), _mb(summary.size_bytes), summary.precision, str(summary.opset),
                          str(summary.ir_version))
    console.print(sizes)
    changes = report.op_changes()
    if changes:
        ops = columns(new_table("nodes by op type (changed)"), ("op", "before", "after", "delta"),
                      numbers=("before", "after", "delta"))
        for op, b, a in changes[:20]:
            ops.add_row(op, str(b), str(a), f"{a - b:+d}")
        if len(changes) > 20:
            ops.add_row(f"... {len(changes) - 20} more (see --json)", "", "", "")
        console.print(ops)
    steps = columns(new_table("steps"), ("step", "seconds", "nodes", "detail"), numbers=("seconds", "nodes"))
    for step in report.steps:
        detail = json.dumps(step.detail, default=str)
        steps.add_row(step.name, f"{step.seconds:.2f}", str(step.nodes_after), escape(detail[:90]))
    console.print(steps)
    _render_precision(report.precision)
    _render_accuracy(report.accuracy, report.passed)
    _render_compile(report.compile)
    console.print(f"run it with: --target {escape(report.run_with or report.target)}")
    if report_path:
        console.print(f"report written to {escape(str(report_path))}")
    if not report.passed:
        err_console.print("[bold red]accuracy gate FAILED[/]: the model was written, but it is not accurate enough "
                          "for the thresholds given (see the checks above).")


def _render_precision(precision: dict) -> None:
    keep = precision.get("keep_fp32") or []
    if precision.get("amp"):
        amp = precision["amp"]
        console.print(f"AMP: {len(keep)} node(s) kept in FP32 after {amp['judgements']} judgement(s) "
                      f"({'passes' if amp['passed'] else 'still fails'} the gate)")
        for step in amp["steps"]:
            console.print(f"  {step['method']}: {', '.join(step['nodes'][:8])}"
                          f"{' ...' if len(step['nodes']) > 8 else ''} ({', '.join(sorted(set(step['op_types'])))})",
                          markup=False)
    elif keep:
        console.print(f"kept in FP32: {', '.join(keep)}", markup=False)
    fp16 = precision.get("fp16")
    if fp16:
        converted = ", ".join(f"{op} x{n}" for op, n in fp16["converted_by_op"].items())
        console.print(f"FP16: {fp16['converted_nodes']} node(s) converted ({converted})", markup=False)
        if fp16["kept_fp32_by_op"]:
            table = columns(new_table("kept in FP32"), ("op", "nodes", "reason"), numbers=("nodes",))
            for op, entry in fp16["kept_fp32_by_op"].items():
                table.add_row(escape(op), str(entry["nodes"]), escape(entry["reason"]))
            console.print(table)
    if precision.get("quantized_nodes"):
        console.print("INT8: " + ", ".join(f"{k} x{v}" for k, v in precision["quantized_nodes"].items()), markup=False)
    if precision.get("coverage"):
        console.print(precision["coverage"]["summary"], markup=False)
    if precision.get("calibration_table"):
        table = precision["calibration_table"]
        console.print(f"calibration table ({table['format']}, {table['entries']} tensors): {escape(table['path'])}")


def _render_accuracy(accuracy: dict, passed: bool) -> None:
    if not accuracy:
        return
    title = f"accuracy vs the original ({accuracy['samples']['count']} sample(s): {accuracy['samples']['source']})"
    shapes = accuracy["samples"].get("shapes") or {}
    if shapes:
        console.print("accuracy checked at " + ", ".join(
            f"{name}=" + " | ".join("x".join(map(str, s)) for s in found) for name, found in shapes.items()),
            markup=False, highlight=False)
    table = columns(new_table(escape(title)), ("check", "threshold", "value", "result", "detail"),
                    numbers=("threshold", "value"))
    for check in accuracy.get("checks", []):
        table.add_row(check["name"], _fmt(check["threshold"]), _fmt(check["value"]),
                      "[green]pass[/]" if check["passed"] else "[bold red]FAIL[/]", escape(check["detail"]))
    console.print(table)
    for out in accuracy.get("comparison", {}).get("outputs", []):
        agree = out.get("topk")
        extra = f", top-1 agreement {agree['top1']:.1%} of {agree['rows']} rows" if agree else ""
        console.print(f"  {out['name']}: max abs err {out['max_abs']:.4g}, mean {out['mean_abs']:.3g}, cosine "
                      f"{out['cosine']:.6f}{extra}", markup=False)
    if accuracy.get("samples_note"):
        note(accuracy["samples_note"])


def _render_compile(compile_info: dict) -> None:
    if not compile_info:
        return
    if compile_info.get("status") != "measured":
        note(compile_info.get("note", "compile times not measured"))
        return
    first = compile_info["first_compile_seconds"]
    console.print(f"compile on {escape(compile_info['target'])}: first {first * 1e3:.0f} ms"
                  f"{' (recorded earlier)' if compile_info['first_was_cached'] else ''}, warm start "
                  f"{compile_info['warm_start_seconds'] * 1e3:.0f} ms ({compile_info['includes']}); "
                  + (f"not cached: {escape(compile_info['uncached'])}" if compile_info.get("uncached")
                     else f"cache {escape(compile_info['entry'])}"))


def _fmt(value) -> str:
    return "-" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))


def _mb(size: int) -> str:
    return f"{size / 1e6:.2f} MB"
