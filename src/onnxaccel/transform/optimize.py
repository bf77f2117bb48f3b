"""``optimize``: graph steps, a precision step, save, then the accuracy gate and compile timings.

Order, and why:
1. opset/IR conversion, ``--fix-shape``, onnxslim: structural, provider-independent.
2. transformer fusions, then ONNX Runtime's graph optimization (the order ORT's own tools use).
   Before an FP16/INT8 conversion the level is capped at *basic*: extended/all insert com.microsoft fused
   ops (FusedConv, FusedGemm...) that the converters do not handle; the runtime still applies them when a
   session is created.
3. precision: FP16 (plain or AMP), INT8 (static QDQ or dynamic), or, with ``native``, nothing: the model
   stays FP32 and the provider converts (migraphx_fp16_enable; migraphx_int8_enable + a calibration table).
4. save (never over the input), compare with the original on sample inputs, time a cold and a warm compile.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from onnxaccel.calibration import SYNTHETIC_WARNING, CalibrationData, load_calibration
from onnxaccel.compare import GateSpec
from onnxaccel.engines.ort_ep_options import calibration_table_refusal
from onnxaccel.errors import OnnxAccelError, UsageError
from onnxaccel.inputs import ImagePreprocess, PreprocessRequest
from onnxaccel.prepost.presets import resolve_preprocess
from onnxaccel.model import Model, load_model
from onnxaccel.model_shapes import bind_examples
from onnxaccel.precision.checkpoint import save_model, validate
from onnxaccel.precision.fp16 import name_unnamed_nodes, set_metadata
from onnxaccel.precision.int8 import Int8Settings
from onnxaccel.target import NATIVE_PRECISION, Target
from onnxaccel.transform import graph
from onnxaccel.transform.data_shapes import data_shapes
from onnxaccel.transform.evaluate import model_at
from onnxaccel.transform.files import OPTIMIZED_FROM_KEY, check_output_path
from onnxaccel.transform.gate import CPU, DivergenceFinder, Gate, gate_samples, need_finder
from onnxaccel.transform.embed_preprocess import embed_into_file
from onnxaccel.transform.gate_report import accuracy_and_timing, loads_here
from onnxaccel.transform.int8_coverage import FlopCounter
from onnxaccel.transform.precision_step import precision_step
from onnxaccel.transform.opset import convert_opset, default_opset, set_ir_version
from onnxaccel.transform.report import ModelSummary, OptimizeReport, StepRecord
from onnxaccel.transform.shapes import fix_shapes
from onnxaccel.transform.simplify import simplify


@dataclass
class OptimizeOptions:
    """What ``onnxaccel optimize`` was asked to do: where to write, for which target, which shapes,
    precision and checks."""
    output: Path
    target: Target = CPU
    force: bool = False
    check: bool = True
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    batch: int | None = None
    fix_shape: bool = False
    opset: int | None = None
    ir_version: int | None = None
    simplify: bool = False
    graph_level: str = "auto"
    transformer_fusions: bool | None = None  # None: when the graph looks like a transformer
    model_type: str = "bert"
    fp16: bool = False
    amp: bool = False
    fp16_block_ops: tuple[str, ...] = ()
    keep_fp32_nodes: tuple[str, ...] = ()
    int8: Int8Settings | None = None
    calibration: str | None = None
    calibration_samples: int = 128
    #: Images of --calibration/--eval-data: an ImagePreprocess, or a request resolved with the model's metadata.
    preprocess: ImagePreprocess | PreprocessRequest | None = None
    native: bool = False
    native_table_format: str = "flatbuffers"  # or "tensorrt"
    eval_data: str | None = None
    eval_samples: int = 8
    seed: int = 0
    gate: GateSpec = field(default_factory=lambda: GateSpec(atol=1e-4, rtol=1e-3))
    #: The FP32 gate, for --native runs judged on the graph only (the provider is not here).
    graph_gate: GateSpec = field(default_factory=lambda: GateSpec(atol=1e-4, rtol=1e-3))
    compile_cache: bool = True
    #: ``--embed-preprocess``: a preset to embed into the image input after the gate (transform/embed_preprocess.py).
    embed_preprocess: str | None = None

    @property
    def precision(self) -> str:
        """The precision the output model has: int8, fp16 (also for --amp) or fp32."""
        return "int8" if self.int8 else ("fp16" if self.fp16 or self.amp else "fp32")


def optimize(source: str | Model, options: OptimizeOptions, find_divergence: DivergenceFinder | None = None,
             count_flops: FlopCounter | None = None) -> OptimizeReport:
    """Transform ``source`` into ``options.output`` and report what changed and how accurate it is.

    ``find_divergence`` (``onnxaccel.analysis.bisect.find_divergence``) is needed for ``options.amp`` only:
    AMP asks it for the node to keep in FP32 next (see transform/gate.py for why it is passed in).
    ``count_flops`` (FLOPs per node, ``analysis``' graph statistics) gives INT8's share of the FLOPs in the
    report (transform/int8_coverage.py); without it only the share of weights is given.
    """
    model = source if isinstance(source, Model) else load_model(source, check=options.check)
    if not isinstance(options.preprocess, ImagePreprocess):  # a request (or None): the preset rules decide
        options = dataclasses.replace(options, preprocess=resolve_preprocess(model.metadata, options.preprocess))
    _check_options(options)
    if options.amp:
        need_finder(find_divergence)  # before any work: AMP cannot search without it
    output = check_output_path(model.path, options.output, force=options.force)
    from_data = _data_bindings(model, options)
    bound, examples = _bind(model, {**from_data, **options.shapes}, options)
    target = options.target
    report = OptimizeReport(model.source, str(output), str(target), ModelSummary.of(model.path, model.proto))
    if examples:
        report.example_dims = [d.to_dict() for d in examples]
        report.notes.append("the accuracy gate and the compile timings ran at " + ", ".join(
            f"{d.label}={d.example}" for d in examples) + " (the example values `inspect` uses; nothing bound "
            "these dims): the written model keeps them dynamic; bind others with --shape DIM=VALUE")
    if options.calibration or options.eval_data:
        pre = options.preprocess
        report.notes.append(f"images in --calibration/--eval-data, if any, are fed as {pre.describe()}"
                            + (f" ({pre.origin})" if pre.origin else ""))
    if from_data:
        report.notes.append(f"shapes from {options.eval_data or options.calibration}: " + ", ".join(
            f"{k}={'x'.join(map(str, v))}" for k, v in from_data.items()) + " (--shape overrides)")
    proto = onnx.load(str(model.path))
    if (named := name_unnamed_nodes(proto)):
        report.notes.append(f"named {named} unnamed node(s) <OpType>_<index> so reports and block lists can refer "
                            "to them")
    steps = _Steps(report)
    with tempfile.TemporaryDirectory(prefix="onnxaccel-optimize-") as tmp:
        reference = bound
        if options.opset:
            # Convert first, so the gate's reference is a model ONNX Runtime can run: ONNX Runtime has no
            # kernels for several opset-6 ops ("Could not find an implementation for Gemm(6)"), and the
            # converted form is what the user asked to check.
            proto, reference = _opset_first(proto, bound, options, steps, Path(tmp))
        _transform_and_gate(proto, model, bound, reference, output, options, find_divergence, steps, count_flops)
    return report


def _bind(model: Model, shapes: dict[str, tuple[int, ...]], options: OptimizeOptions):
    """The model bound for the gate, and the dims that took example values (model_shapes.bind_examples, as
    ``inspect`` binds them). --fix-shape writes the bound shapes into the model, so there every dim must be
    bound by the user or the model: an unbound one is the usual error naming it."""
    if options.fix_shape:
        return model.bind(shapes, batch=options.batch), []
    bound, examples = bind_examples(model, shapes, options.batch)
    return bound, list({d.label: d for d in examples}.values())


def _data_bindings(model: Model, options: OptimizeOptions) -> dict[str, tuple[int, ...]]:
    """Input shapes from the --eval-data (else --calibration) arrays, for what --shape leaves open
    (docs/SHAPES.md, step 2 of the resolution order)."""
    return data_shapes(options.eval_data or options.calibration, model, options.shapes, options.batch)


def _transform_and_gate(proto, model: Model, bound: Model, reference: Model, output: Path,
                        options: OptimizeOptions, find_divergence: DivergenceFinder | None,
                        steps: _Steps, count_flops: FlopCounter | None = None) -> None:
    report = steps.report
    given = Path(model.path)  # what the user gave: the checker's failures of it are the input's, not ours
    proto = _graph_steps(proto, bound, options, steps)
    if report.steps and options.precision != "fp32" and not options.native:
        # Check the graph steps' result here, so that a conversion below never takes an invalid intermediate
        # (ONNX Runtime's optimized graph) for the user's model.
        validate(proto, f"optimize ({', '.join(s.name for s in report.steps)})", original=given)
    calibration = _calibration(bound, options, report) if options.int8 and options.calibration else None
    gate = Gate(reference, gate_samples(bound, eval_data=options.eval_data, calibration=calibration,
                                        count=options.eval_samples, preprocess=options.preprocess,
                                        seed=options.seed),
                options.gate, candidate_target=_eval_target(options.target, report), find_divergence=find_divergence)
    proto = precision_step(proto, options, calibration, gate, steps, report, bound=bound, source=model.source,
                           count_flops=count_flops)
    if options.ir_version:
        proto = steps.run("ir-version", lambda p: set_ir_version(p, options.ir_version), proto)
    set_metadata(proto, OPTIMIZED_FROM_KEY, Path(model.path).name)
    names = ", ".join(s.name for s in report.steps)
    save_model(proto, output, converter=f"optimize ({names})" if names else "optimize", original=given)
    report.after = ModelSummary.of(output, proto)

    try:
        accuracy_and_timing(report, gate, output, options)
    except OnnxAccelError as exc:
        _discard(output, exc)
        raise
    if options.embed_preprocess:
        _embed(output, options, report)


def _discard(output: Path, exc: OnnxAccelError) -> None:
    """Remove a written model the gate could not run (ONNX Runtime refused it), so no file is left behind that
    looks like a result, and a retry needs no --force; the error's hint says so."""
    for path in (output, output.with_name(output.name + ".data")):
        path.unlink(missing_ok=True)
    exc.hint = (f"{exc.hint} " if exc.hint else "") + (f"The model written to {output} could not be run here, so "
                                                       "it was removed; run optimize again once this is fixed.")


def _embed(output: Path, options: OptimizeOptions, report: OptimizeReport) -> None:
    """Embed the preprocessing preset into the written model (after the gate, which compares float inputs) and
    record it; the embedding checks itself against host preprocessing (embed_into_file)."""
    done, worst = embed_into_file(output, options.embed_preprocess, seed=options.seed)
    report.embedded_preprocess = {**done.to_dict(), "max_abs_diff_vs_host": worst}
    report.notes.append(f"embedded preprocessing: {done.describe()}; equal to host preprocessing on random uint8 "
                        f"pixels (max |diff| {worst:.2g}). The accuracy gate and timings above are of the model "
                        "before embedding (float inputs).")
    report.after = ModelSummary.of(output, onnx.load(str(output)))


def _opset_first(proto, bound: Model, options: OptimizeOptions, steps: _Steps, folder: Path):
    """Convert to ``options.opset``; return the new proto and the bound model the gate's reference runs."""
    before = default_opset(proto)
    proto = steps.run("opset", lambda p: convert_opset(p, options.opset), proto,
                      {"opset": options.opset, "from": before})
    if before == options.opset:
        return proto, bound
    path = save_model(proto, folder / "opset.onnx", converter=f"opset conversion {before} -> {options.opset} "
                      "(onnx.version_converter)")
    steps.report.notes.append(f"converted from opset {before} to {options.opset} before the accuracy gate: the "
                              f"reference outputs come from the opset-{options.opset} model (FP32, CPU)")
    return proto, dataclasses.replace(model_at(path, bound), source=bound.source)


class _Steps:
    def __init__(self, report: OptimizeReport):
        self.report = report

    def run(self, name: str, func, proto: onnx.ModelProto, detail: dict | None = None) -> onnx.ModelProto:
        start = time.perf_counter()
        result = func(proto)
        self.report.steps.append(StepRecord(name, time.perf_counter() - start, len(result.graph.node), detail or {}))
        return result


def _check_options(options: OptimizeOptions) -> None:
    target = options.target
    if options.int8 and (options.fp16 or options.amp):
        raise UsageError("--fp16/--amp and --int8 exclude each other.", "Choose one precision per run.")
    if options.native:
        want = options.precision
        if want == "fp32" or (target.device, want) not in NATIVE_PRECISION:
            raise UsageError(
                f"--native leaves {want.upper()} to the provider, but {target.device} has no {want} switch.",
                "Native precision exists for --target migraphx (fp16) and tensorrt (fp16, int8); for other "
                "targets drop --native and the model is converted.")
        if options.amp:
            raise UsageError("--amp converts the model; --native leaves precision to the provider.", "Choose one.")
        if options.int8 and options.int8.mode != "static":
            raise UsageError("--native INT8 needs calibration (--int8 static).", "Use --int8 static --native.")
        if options.int8 and target.device == "migraphx":
            raise calibration_table_refusal()
    if options.int8 and options.int8.mode == "static" and not options.calibration:
        raise UsageError("--int8 static needs calibration data.",
                         "Give --calibration DIR_OF_IMAGES or FILE.npz (or `synthetic` to test the pipeline only).")
    if options.native_table_format not in ("flatbuffers", "tensorrt"):
        raise UsageError(f"Unknown calibration table format '{options.native_table_format}'.",
                         "Use flatbuffers (ORT-generated, the default) or tensorrt.")


def _graph_steps(proto: onnx.ModelProto, bound: Model, options: OptimizeOptions, steps: _Steps) -> onnx.ModelProto:
    report = steps.report
    if options.fix_shape:
        fixed = {}

        def fix(p):
            new, shapes = fix_shapes(p, bound)
            fixed.update(shapes)
            return new

        proto = steps.run("fix-shape", fix, proto)
        report.steps[-1].detail = {"shapes": fixed}
    if options.simplify:
        proto = steps.run("simplify", simplify, proto, {"tool": "onnxslim"})
    fusions = options.transformer_fusions
    if fusions is None:
        fusions = graph.is_transformer(proto)
        if fusions:
            report.notes.append("the graph looks like a transformer: applied attention/LayerNorm/GELU fusions")
    if fusions:
        stats: dict = {}

        def fuse(p):
            new, found = graph.transformer_fusions(p, model_type=options.model_type, use_gpu=options.target.is_gpu)
            stats.update(found)
            return new

        proto = steps.run("transformer-fusions", fuse, proto)
        report.steps[-1].detail = {"model_type": options.model_type, "fused": stats}
    level, provider, notes = graph.choose_level(options.graph_level, options.target)
    report.notes.extend(notes)
    converting = options.precision != "fp32" and not options.native
    if converting and level in ("extended", "all"):
        report.notes.append(f"graph level '{level}' lowered to 'basic' before {options.precision.upper()} conversion: "
                            "extended/all add fused contrib ops the converters do not handle; ONNX Runtime still "
                            "applies them when it loads the model")
        level = "basic"
    if level != "none":
        detail = {"level": level, "provider": provider, "requested": options.graph_level}
        try:
            proto = steps.run("graph", lambda p: graph.ort_optimize(p, level, provider, reloadable=True), proto,
                              detail)
        except graph.UnreloadableGraphError as exc:  # the model as given runs; ORT optimizes it at load anyway
            report.warnings.append(f"{exc.message}; the graph step was skipped (the model is written without "
                                   "ONNX Runtime's optimizations, which ONNX Runtime applies when it loads it)")
            report.steps.append(StepRecord("graph", 0.0, len(proto.graph.node), {**detail, "skipped": exc.message}))
    return proto


def _calibration(bound: Model, options: OptimizeOptions, report: OptimizeReport) -> CalibrationData:
    data = load_calibration(options.calibration, bound, max_samples=options.calibration_samples,
                            preprocess=options.preprocess, seed=options.seed)
    if data.synthetic:
        report.warnings.append(SYNTHETIC_WARNING)
    report.precision["calibration"] = data.to_dict()
    return data


def _eval_target(target: Target, report: OptimizeReport) -> Target:
    """The target the optimized model is judged on: the requested one when it loads here, else the CPU."""
    engine = dataclasses.replace(target, precision="fp32")
    if loads_here(engine):
        return engine
    report.notes.append(f"{target.device} does not load on this machine: the optimized model was judged on the "
                        "CPU provider; run the same `onnxaccel optimize` on the target machine to gate it there")
    return CPU
