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
from typing import Annotated

import typer
from rich.markup import escape
from rich.panel import Panel

from onnxaccel.cli.common import (
    PreprocessOpt,
    BatchOpt, JsonOpt, ShapeOpt, TargetOpt, console, err_console, handle_errors, note, print_json,
    resolve_target,
)
from onnxaccel.cli.groups import floats
from onnxaccel.cli.tables import columns, new_table
from onnxaccel.compare import DEFAULT_TOLERANCES, GateSpec
from onnxaccel.errors import InputError, UsageError
from onnxaccel.prepost.presets import PreprocessRequest
from onnxaccel.model import parse_shape_bindings
from onnxaccel.precision.int8 import Int8Settings
from onnxaccel.target import NATIVE_PRECISION

# common.EpOptionOpt takes -o as its short flag; here -o is the output, as in most converters.
EpOptionOpt = Annotated[
    list[str] | None,
    typer.Option("--ep-option", help="Provider or session option KEY=VALUE for the target; repeatable."),
]


def register(app: typer.Typer) -> None:
    """Add the ``optimize`` command to the application."""
    app.command("optimize", help="Write an optimized model (graph optimization, simplification, fixed shapes, "
                "FP16 with automatic mixed precision, INT8 with calibration) and a report: nodes before/after, "
                "size, precision, accuracy against the original, first-compile and warm-start times. Exits 1 "
                "when the accuracy gate fails (the report is still written).")(optimize_command)


#: Default cosine floor for INT8 when no threshold is given: catches collapsed quantization (outputs rounded
#: to zero or constant), not the ordinary quantization noise (the PP-OCR classifier's INT8 probabilities:
#: cosine 0.988 against FP32).
INT8_MIN_COSINE = 0.95


def default_gate(precision: str, atol: float | None, rtol: float | None, max_error: float | None,
                 min_topk_agreement: float | None, topk: int, min_cosine: float | None = None):
    """Tolerances default to `compare`'s per precision. INT8 checks elementwise only when asked, and a
    cosine floor when no threshold at all is given."""
    d_atol, d_rtol = DEFAULT_TOLERANCES[precision]
    elementwise = precision != "int8" or atol is not None or rtol is not None
    given = (atol, rtol, max_error, min_topk_agreement, min_cosine)
    if precision == "int8" and all(v is None for v in given):
        min_cosine = INT8_MIN_COSINE
    return GateSpec(atol=d_atol if atol is None else atol, rtol=d_rtol if rtol is None else rtol,
                    elementwise=elementwise, max_error=max_error, min_topk_agreement=min_topk_agreement, topk=topk,
                    min_cosine=min_cosine)


@handle_errors
def optimize_command(
    model: Annotated[str, typer.Argument(help="An .onnx file or zoo:NAME. It is never modified.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the optimized model (.onnx).")],
    target: TargetOpt = "auto",
    ep_option: EpOptionOpt = None,
    shape: ShapeOpt = None,
    batch: BatchOpt = None,
    fix_shape: Annotated[bool, typer.Option("--fix-shape", help="Stamp the bound shapes (--shape/--batch) into the "
                         "model, so compiling providers (MIGraphX) compile once instead of per shape.")] = False,
    opset: Annotated[int | None, typer.Option(help="Convert to this ai.onnx opset (onnx.version_converter).")] = None,
    ir_version: Annotated[int | None, typer.Option("--ir-version", help="Stamp this IR version (if the opset "
                          "allows).")] = None,
    simplify: Annotated[bool, typer.Option("--simplify/--no-simplify", help="Constant folding and cleanup with "
                        "onnxslim (pip install 'onnxaccel\\[optimize]').")] = False,
    graph_level: Annotated[str, typer.Option("--graph-level", help="ONNX Runtime graph optimization saved in the "
                           "model: auto (extended on cpu, basic elsewhere), none, basic, extended, all.")] = "auto",
    transformer_fusions: Annotated[bool | None, typer.Option("--transformer-fusions/--no-transformer-fusions",
                                   help="Attention/LayerNorm/GELU fusions; default: when the graph looks like a "
                                   "transformer.", show_default=False)] = None,
    model_type: Annotated[str, typer.Option(help="Model type for transformer fusions (bert, gpt2, bart, t5, "
                          "...).")] = "bert",
    fp16: Annotated[bool, typer.Option("--fp16", help="Convert to FP16 with FP32 inputs/outputs.")] = False,
    amp: Annotated[bool, typer.Option("--amp", help="FP16 with automatic mixed precision: nodes whose FP16 output "
                   "breaks the tolerance stay FP32 (implies --fp16).")] = False,
    fp16_block_op: Annotated[list[str] | None, typer.Option("--fp16-block-op", help="Op type to keep in FP32; "
                             "repeatable.")] = None,
    keep_fp32: Annotated[list[str] | None, typer.Option("--keep-fp32", help="Node name to keep in FP32; "
                         "repeatable.")] = None,
    int8: Annotated[str | None, typer.Option("--int8", help="static (QDQ, needs --calibration) or dynamic "
                    "(transformer MatMuls).")] = None,
    calibration: Annotated[str | None, typer.Option("--calibration", help="Calibration data: a folder of "
                           "images, an .npz named by input, a folder of .npy/.npz, or `synthetic` (testing "
                           "only).")] = None,
    calibration_samples: Annotated[int, typer.Option(help="Most calibration samples to use.")] = 128,
    calibration_method: Annotated[str, typer.Option(help="minmax, entropy or percentile.")] = "minmax",
    percentile: Annotated[float, typer.Option(help="Percentile for --calibration-method percentile.")] = 99.999,
    per_channel: Annotated[bool, typer.Option("--per-channel/--per-tensor", help="Per-channel INT8 weights.")] = True,
    int8_activations: Annotated[str, typer.Option(help="int8 (S8S8, recommended) or uint8.")] = "int8",
    int8_exclude: Annotated[list[str] | None, typer.Option("--int8-exclude", help="Node to leave unquantized; "
                            "repeatable.")] = None,
    native: Annotated[bool, typer.Option("--native", help="Leave FP16/INT8 to the provider (migraphx_fp16_enable; "
                      "migraphx_int8_enable + a calibration table; trt_*): the model stays FP32.")] = False,
    table_format: Annotated[str, typer.Option(help="Calibration table for --native INT8: flatbuffers "
                            "(ORT-generated) or tensorrt (TRT- text cache).")] = "flatbuffers",
    eval_data: Annotated[str | None, typer.Option("--eval-data", help="Inputs for the accuracy gate (same forms "
                         "as --calibration); default: the calibration data, else synthesized inputs.")] = None,
    eval_samples: Annotated[int, typer.Option(help="Samples the accuracy gate runs.")] = 8,
    atol: Annotated[float | None, typer.Option(help="Absolute tolerance (default by precision, as `compare`).")] = None,
    rtol: Annotated[float | None, typer.Option(help="Relative tolerance (default by precision).")] = None,
    max_error: Annotated[float | None, typer.Option("--max-error", help="Fail when any output's largest absolute "
                         "error exceeds this.")] = None,
    min_topk_agreement: Annotated[float | None, typer.Option("--min-topk-agreement", help="Fail when classifier "
                                  "outputs agree on fewer than this fraction of rows (0..1).")] = None,
    topk: Annotated[int, typer.Option(help="K for --min-topk-agreement (1 = top-1 agreement).")] = 1,
    min_cosine: Annotated[float | None, typer.Option("--min-cosine", help="Fail when any output's cosine "
                          "similarity with the original is below this (INT8 default 0.95 when no threshold is "
                          "given).")] = None,
    preprocess: PreprocessOpt = None,
    mean: Annotated[str | None, typer.Option(help="Image normalization mean, e.g. 0.485,0.456,0.406.")] = None,
    std: Annotated[str | None, typer.Option(help="Image normalization std.")] = None,
    resize: Annotated[int | None, typer.Option(help="Image shorter side before the center crop.")] = None,
    layout: Annotated[str, typer.Option(help="Image tensor layout: nchw or nhwc.")] = "nchw",
    bgr: Annotated[bool, typer.Option("--bgr", help="Images as BGR.")] = False,
    seed: Annotated[int, typer.Option(help="Seed for synthesized inputs.")] = 0,
    embed_preprocess: Annotated[str | None, typer.Option(
        "--embed-preprocess", help="Put preprocessing into the graph: the image input then takes uint8 NHWC "
        "pixels and the model does cast, scale, mean/std and the transpose (imagenet: /255 and ImageNet mean/std; "
        "yolo, scale01: /255). Resize/crop/letterbox stay outside. Checked equal to host preprocessing.")] = None,
    compile_cache: Annotated[bool, typer.Option("--compile-cache/--no-compile-cache", help="Time a first compile "
                             "and a warm start through the compile cache.")] = True,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --output when it exists, even when it is the "
                                        "input model.")] = False,
    no_check: Annotated[bool, typer.Option("--no-check", help="Skip the ONNX checker on the input.")] = False,
    report_path: Annotated[Path | None, typer.Option("--report", help="Also write the report as JSON here.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Write an optimized copy of a model and print what changed."""
    from onnxaccel.analysis.bisect import find_divergence  # heavy: loaded per command
    from onnxaccel.transform.optimize import OptimizeOptions, optimize

    tgt = resolve_target(target, None, ep_option)
    fp16, amp, int8, native = _precision_from_target(tgt, fp16, amp, int8, native)
    settings = None
    if int8:
        settings = Int8Settings(mode=int8.lower(), method=calibration_method.lower(), per_channel=per_channel,
                                activations=int8_activations.lower(), percentile=percentile,
                                exclude_nodes=tuple(int8_exclude or ()))
    precision = "int8" if settings else ("fp16" if fp16 or amp else "fp32")
    if report_path is not None and report_path.suffix.lower() != ".json":
        raise UsageError(f"--report {report_path} should end in .json.",
                         f"e.g. --report {report_path.with_suffix('.json')}")
    options = OptimizeOptions(
        output=output, target=tgt.with_precision("fp32"), force=force, check=not no_check,
        shapes=parse_shape_bindings(shape or []), batch=batch, fix_shape=fix_shape, opset=opset,
        ir_version=ir_version, simplify=simplify, graph_level=graph_level.lower(),
        transformer_fusions=transformer_fusions, model_type=model_type, fp16=fp16, amp=amp,
        fp16_block_ops=tuple(fp16_block_op or ()), keep_fp32_nodes=tuple(keep_fp32 or ()), int8=settings,
        calibration=calibration, calibration_samples=calibration_samples,
        preprocess=_preprocess(preprocess, mean, std, resize, layout, bgr),
        native=native, native_table_format=table_format.lower(), eval_data=eval_data, eval_samples=eval_samples,
        seed=seed, gate=default_gate(precision, atol, rtol, max_error, min_topk_agreement, topk, min_cosine),
        graph_gate=default_gate("fp32", atol, rtol, max_error, min_topk_agreement, topk, min_cosine),
        compile_cache=compile_cache, embed_preprocess=embed_preprocess.lower() if embed_preprocess else None,
    )
    refuse_existing_output(model, output, force)
    with err_console.status("optimizing...", spinner="dots") if not as_json else _nothing():
        report = optimize(model, options, find_divergence)
    data = report.to_dict()
    if report_path is not None:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    if as_json:
        print_json(data)
    else:
        render(report, report_path)
    if not report.passed:
        raise typer.Exit(1)


def refuse_existing_output(model: str, output: Path, force: bool) -> None:
    """Refuse to replace an existing --output without --force, as --force's help says (issue 23: an earlier
    output was overwritten silently). The input itself and files another tool wrote are left to
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


def _precision_from_target(tgt, fp16: bool, amp: bool, int8: str | None, native: bool):
    """`-t migraphx/fp16` alone means --fp16 --native; `-t cpu/fp16` means --fp16; int8 likewise (static)."""
    if tgt.precision == "fp32" or fp16 or amp or int8:
        return fp16, amp, int8, native
    # MIGraphX INT8 is a QDQ model (the EP's own INT8 needs a table it never uses: engines/ort_ep_options.py).
    provider_native = (tgt.device, tgt.precision) in NATIVE_PRECISION and (tgt.device, tgt.precision) != (
        "migraphx", "int8")
    if tgt.precision == "fp16":
        return True, False, None, native or provider_native
    return False, False, "static", native or provider_native


def _preprocess(preset, mean, std, resize, layout, bgr) -> PreprocessRequest:
    """What the command line asks of image preprocessing (calibration and eval-data images); the model's metadata
    fills the rest in transform.optimize (the preset rules of docs/PREPROCESSING.md, as `run` and `batch`)."""
    if layout.lower() not in ("nchw", "nhwc"):
        raise InputError(f"--layout must be nchw or nhwc, got '{layout}'.", "Use --layout nchw or --layout nhwc.")
    return PreprocessRequest(preset=preset.lower() if preset else None, mean=floats(mean, "--mean") if mean else None,
                             std=floats(std, "--std") if std else None, resize=resize, layout=layout.lower(),
                             channel_order="bgr" if bgr else "rgb")


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
    if precision.get("calibration_table"):
        table = precision["calibration_table"]
        console.print(f"calibration table ({table['format']}, {table['entries']} tensors): {escape(table['path'])}")


def _render_accuracy(accuracy: dict, passed: bool) -> None:
    if not accuracy:
        return
    title = f"accuracy vs the original ({accuracy['samples']['count']} sample(s): {accuracy['samples']['source']})"
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
                  f"{compile_info['warm_start_seconds'] * 1e3:.0f} ms ({compile_info['includes']}); cache "
                  f"{escape(compile_info['entry'])}")


def _fmt(value) -> str:
    return "-" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))


def _mb(size: int) -> str:
    return f"{size / 1e6:.2f} MB"
