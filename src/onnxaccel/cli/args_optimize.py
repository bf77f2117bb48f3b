"""Argument groups of `optimize`: where the optimized model goes, the graph rewrites, the precision
conversion (FP16, AMP, INT8 and its calibration) and the accuracy gate it must pass."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from onnxaccel import providers
from onnxaccel.cli.args_data import SEED
from onnxaccel.cli.args_model import TargetArgs
from onnxaccel.cli.compose import REQUIRED, Built, Group, option
from onnxaccel.errors import UsageError
from onnxaccel.target import NATIVE_PRECISION

#: Default cosine floor for INT8 when no threshold is given: catches collapsed quantization (outputs rounded
#: to zero or constant), not the ordinary quantization noise, which stays well above it.
INT8_MIN_COSINE = 0.95


def default_gate(precision: str, atol: float | None, rtol: float | None, max_error: float | None,
                 min_topk_agreement: float | None, topk: int, min_cosine: float | None = None):
    """Tolerances default to `compare`'s per precision. INT8 checks elementwise only when asked, and a
    cosine floor when no threshold at all is given."""
    from onnxaccel.compare import DEFAULT_TOLERANCES, GateSpec  # numpy: imported when the command runs

    d_atol, d_rtol = DEFAULT_TOLERANCES[precision]
    elementwise = precision != "int8" or atol is not None or rtol is not None
    given = (atol, rtol, max_error, min_topk_agreement, min_cosine)
    if precision == "int8" and all(v is None for v in given):
        min_cosine = INT8_MIN_COSINE
    return GateSpec(atol=d_atol if atol is None else atol, rtol=d_rtol if rtol is None else rtol,
                    elementwise=elementwise, max_error=max_error, min_topk_agreement=min_topk_agreement, topk=topk,
                    min_cosine=min_cosine)


class WriteArgs(Group):
    """--output (required), --force and --report (a .json file, checked). Builds their values."""

    PARAMS = (
        option("output", Path, REQUIRED, "--output", "-o", help="Where to write the optimized model (.onnx)."),
        option("force", bool, False, "--force", help="Overwrite --output when it exists, even when it is the "
               "input model."),
        option("report_path", Path | None, None, "--report", help="Also write the report as JSON here."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        if v.report_path is not None and v.report_path.suffix.lower() != ".json":
            raise UsageError(f"--report {v.report_path} should end in .json.",
                             f"e.g. --report {v.report_path.with_suffix('.json')}")
        return v


class GraphArgs(Group):
    """The graph rewrites: --fix-shape, --opset, --ir-version, --simplify, --graph-level, --transformer-fusions,
    --model-type. Builds their values (--graph-level lower-cased)."""

    PARAMS = (
        option("fix_shape", bool, False, "--fix-shape", help="Stamp the bound shapes (--shape/--batch) into the "
               "model, so compiling providers (MIGraphX) compile once instead of per shape."),
        option("opset", int | None, None, help="Convert to this ai.onnx opset (onnx.version_converter)."),
        option("ir_version", int | None, None, "--ir-version", help="Stamp this IR version (if the opset allows)."),
        option("simplify", bool, False, "--simplify/--no-simplify", help="Constant folding and cleanup with "
               "onnxslim (pip install 'onnxaccel\\[optimize]')."),
        option("graph_level", str, "auto", "--graph-level", help="ONNX Runtime graph optimization saved in the "
               "model: auto (extended on cpu, basic elsewhere), none, basic, extended, all."),
        option("transformer_fusions", bool | None, None, "--transformer-fusions/--no-transformer-fusions",
               help="Attention/LayerNorm/GELU fusions; default: when the graph looks like a transformer.",
               show_default=False),
        option("model_type", str, "bert", help="Model type for transformer fusions (bert, gpt2, bart, t5, ...)."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        return SimpleNamespace(**{**vars(v), "graph_level": v.graph_level.lower()})


class ConversionArgs(Group):
    """The precision conversion: --fp16, --amp, --fp16-block-op, --keep-fp32, --int8 and its calibration,
    --native, --table-format. A target's /PRECISION alone implies them (``-t migraphx/fp16``: --fp16 --native).
    Builds the flags so resolved, the ``Int8Settings`` (or None) and the resulting ``precision``."""

    PARAMS = (
        option("fp16", bool, False, "--fp16", help="Convert to FP16 with FP32 inputs/outputs."),
        option("amp", bool, False, "--amp", help="FP16 with automatic mixed precision: nodes whose FP16 output "
               "breaks the tolerance stay FP32 (implies --fp16)."),
        option("fp16_block_op", list[str] | None, None, "--fp16-block-op", help="Op type to keep in FP32; "
               "repeatable."),
        option("keep_fp32", list[str] | None, None, "--keep-fp32", help="Node name to keep in FP32; repeatable."),
        option("int8", str | None, None, "--int8", help="static (QDQ, needs --calibration) or dynamic (transformer "
               "MatMuls)."),
        option("calibration", str | None, None, "--calibration", help="Calibration data: a folder of images, an "
               ".npz named by input, a folder of .npy/.npz, or `synthetic` (testing only)."),
        option("calibration_samples", int, 128, help="Most calibration samples to use."),
        option("calibration_method", str, "minmax", help="minmax, entropy or percentile."),
        option("percentile", float, 99.999, help="Percentile for --calibration-method percentile."),
        option("per_channel", bool, True, "--per-channel/--per-tensor", help="Per-channel INT8 weights."),
        option("int8_activations", str, "int8", help="int8 (S8S8, recommended) or uint8."),
        option("int8_exclude", list[str] | None, None, "--int8-exclude", help="Node to leave unquantized; "
               "repeatable."),
        option("native", bool, False, "--native", help="Leave FP16/INT8 to the provider ("
               + "; ".join(f"{s.device}: {', '.join(k for o in s.native_precision.values() for k in o)}"
                           for s in providers.all_specs() if s.native_precision)
               + "; INT8 with a calibration table): the model stays FP32."),
        option("table_format", str, "flatbuffers", help="Calibration table for --native INT8: flatbuffers "
               "(ORT-generated) or tensorrt (TRT- text cache)."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        fp16, amp, int8, native = _precision_from_target(ctx[TargetArgs], v.fp16, v.amp, v.int8, v.native)
        settings = None
        if int8:
            from onnxaccel.precision.int8 import Int8Settings  # onnx: imported when the command runs

            settings = Int8Settings(mode=int8.lower(), method=v.calibration_method.lower(), per_channel=v.per_channel,
                                    activations=v.int8_activations.lower(), percentile=v.percentile,
                                    exclude_nodes=tuple(v.int8_exclude or ()))
        precision = "int8" if settings else ("fp16" if fp16 or amp else "fp32")
        return SimpleNamespace(**{**vars(v), "fp16": fp16, "amp": amp, "native": native, "int8": settings,
                                  "precision": precision, "table_format": v.table_format.lower()})


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


class GateArgs(Group):
    """The accuracy gate and what it runs: --eval-data, --eval-samples, --atol, --rtol, --max-error,
    --min-topk-agreement, --topk, --min-cosine, --seed, --compile-cache. Builds their values with ``gate``
    (at the conversion's precision) and ``graph_gate`` (fp32, for the graph rewrites)."""

    PARAMS = (
        option("eval_data", str | None, None, "--eval-data", help="Inputs for the accuracy gate (same forms as "
               "--calibration); default: the calibration data, else synthesized inputs."),
        option("eval_samples", int, 8, help="Samples the accuracy gate runs."),
        option("atol", float | None, None, help="Absolute tolerance (default by precision, as `compare`)."),
        option("rtol", float | None, None, help="Relative tolerance (default by precision)."),
        option("max_error", float | None, None, "--max-error", help="Fail when any output's largest absolute error "
               "exceeds this."),
        option("min_topk_agreement", float | None, None, "--min-topk-agreement", help="Fail when classifier outputs "
               "agree on fewer than this fraction of rows (0..1)."),
        option("topk", int, 1, help="K for --min-topk-agreement (1 = top-1 agreement)."),
        option("min_cosine", float | None, None, "--min-cosine", help="Fail when any output's cosine similarity "
               "with the original is below this (INT8 default 0.95 when no threshold is given)."),
        SEED,
        option("compile_cache", bool, True, "--compile-cache/--no-compile-cache", help="Time a first compile and a "
               "warm start through the compile cache."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        limits = (v.atol, v.rtol, v.max_error, v.min_topk_agreement, v.topk, v.min_cosine)
        return SimpleNamespace(**vars(v), gate=default_gate(ctx[ConversionArgs].precision, *limits),
                               graph_gate=default_gate("fp32", *limits))
