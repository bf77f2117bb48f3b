"""Dynamic INT8 quantization with ONNX Runtime's quantizer, and what every INT8 mode shares.

Dynamic quantization is what `run`/`bench`/`compare -p int8` on the CPU run (:mod:`onnxaccel.precision.variant`),
so it lives below the pipeline; static QDQ quantization with calibration data is `optimize --int8 static`
(:mod:`onnxaccel.transform.int8`), which builds on the settings and helpers here.

Facts this module relies on (onnxruntime.quantization, ORT 1.32; ORT docs "Quantize ONNX models",
https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html):

* The docs recommend dynamic quantization for transformers and RNNs, static for CNNs; S8S8 (int8 activations
  and weights) with QDQ is their first choice for static mode.
* Dynamic quantization of Conv produces ConvInteger, which runs slower than FP32 Conv on the CPU EP
  (docs/BENCHMARKS.md); dynamic mode therefore quantizes MatMul/Gemm/Attention only.
* Per-channel weights need opset >= 13 (DequantizeLinear's ``axis`` attribute arrived in opset 13); a
  per-channel caller upgrades the model first (:func:`onnxaccel.transform.int8.upgrade_for_qdq`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import platform
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from onnxaccel.errors import MissingDependencyError, ModelError, UsageError
from onnxaccel.precision.fp16 import PRECISION_KEY, set_metadata

METHODS = ("minmax", "entropy", "percentile")
MODES = ("static", "dynamic")
#: Ops dynamic quantization touches (transformer MatMuls and fused Attention, classifier heads).
DYNAMIC_OPS = ("MatMul", "Gemm", "Attention")
#: Fused contrib ops (Attention, SkipLayerNormalization...) defeat the quantizer's shape inference ("Unable to
#: find data type for weight_name=..."); its own error message suggests this default.
DEFAULT_TENSOR_TYPE = {"DefaultTensorType": onnx.TensorProto.FLOAT}
#: Metadata key set on dynamically quantized models whose weights use 7 bits (reduce_range).
REDUCE_RANGE_KEY = "onnxaccel.int8_reduce_range"
#: QDQ with per-channel weights needs DequantizeLinear's axis attribute (opset 13).
MIN_QDQ_OPSET = 13


@dataclass(frozen=True)
class Int8Settings:
    """How to quantize: static (calibrated QDQ) or dynamic, the calibration method, per-channel weights,
    activation type and symmetry, which ops and which nodes; checked on construction."""

    mode: str = "static"
    method: str = "minmax"
    per_channel: bool = True
    #: int8 (S8S8, the ORT docs' first choice) or uint8 (U8S8).
    activations: str = "int8"
    symmetric_activations: bool = False
    #: ORT's CalibPercentile for the percentile method.
    percentile: float = 99.999
    op_types: tuple[str, ...] = ()
    exclude_nodes: tuple[str, ...] = field(default_factory=tuple)
    #: Dynamic mode: 7-bit weights (ORT's reduce_range). None: on x86 CPUs without VNNI only, where ONNX
    #: Runtime's U8S8 integer GEMM can saturate (its quantization guide's advice); see needs_reduce_range.
    reduce_range: bool | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise UsageError(f"Unknown INT8 mode '{self.mode}'.", f"Use one of: {', '.join(MODES)}.")
        if self.method not in METHODS:
            raise UsageError(f"Unknown calibration method '{self.method}'.", f"Use one of: {', '.join(METHODS)}.")
        if self.activations not in ("int8", "uint8"):
            raise UsageError(f"INT8 activations must be int8 or uint8, got '{self.activations}'.",
                             "Use --int8-activations int8 (S8S8, recommended) or uint8.")
        if not 90.0 <= self.percentile <= 100.0:
            raise UsageError(f"--percentile must be within 90..100, got {self.percentile}.", "e.g. --percentile 99.999")

    def to_dict(self) -> dict:
        """The settings as the optimize report records them (reduce_range resolved for this machine)."""
        return {"mode": self.mode, "method": self.method if self.mode == "static" else None,
                "reduce_range": (needs_reduce_range() if self.reduce_range is None else self.reduce_range)
                if self.mode == "dynamic" else None,
                "per_channel": self.per_channel, "activations": self.activations,
                "symmetric_activations": self.symmetric_activations, "percentile": self.percentile,
                "op_types": list(self.op_types), "exclude_nodes": list(self.exclude_nodes)}


def quantize_dynamic(proto: onnx.ModelProto, settings: Int8Settings | None = None, *,
                     source: str = "MODEL") -> onnx.ModelProto:
    """Dynamic quantization: INT8 weights for MatMul/Gemm/Attention; activations quantized per run.

    Raises :class:`ModelError` when nothing was quantized (a CNN: dynamic mode leaves Conv alone), rather
    than returning the FP32 model under an INT8 label; ``source`` names the model in the hint. Per-channel
    weights need opset >= 13: upgrade the model first (:func:`onnxaccel.transform.int8.upgrade_for_qdq`).
    """
    settings = settings or Int8Settings(mode="dynamic", per_channel=False)
    if settings.per_channel:
        _check_per_channel_opset(proto)
    ops = list(settings.op_types or DYNAMIC_OPS)
    if not any(n.op_type in ops for n in proto.graph.node):
        raise nothing_quantized(proto, "dynamic", ops, source)
    reduce = needs_reduce_range() if settings.reduce_range is None else settings.reduce_range
    q = import_quantization()
    with tempfile.TemporaryDirectory(prefix="onnxaccel-int8-") as tmp:
        path = Path(tmp) / "model.onnx"
        out = Path(tmp) / "int8.onnx"
        large = proto.ByteSize() > 1_800_000_000
        onnx.save_model(proto, str(path), save_as_external_data=large)
        with QuietQuantizer():
            try:
                q.quantize_dynamic(str(path), str(out), op_types_to_quantize=ops,
                                   per_channel=settings.per_channel, weight_type=q.QuantType.QInt8,
                                   nodes_to_exclude=list(settings.exclude_nodes) or None,
                                   use_external_data_format=large, extra_options=DEFAULT_TENSOR_TYPE,
                                   reduce_range=reduce)
            except Exception as exc:  # noqa: BLE001
                raise quantize_error("Dynamic INT8 quantization", exc, "or --no-transformer-fusions") from exc
        result = onnx.load(str(out))
    if not quantized_node_count(result):
        raise nothing_quantized(proto, "dynamic", ops, source)
    set_metadata(result, PRECISION_KEY, "int8-dynamic")
    if reduce:
        set_metadata(result, REDUCE_RANGE_KEY, "true")
    return result


def needs_reduce_range(cpu_flags: set[str] | None = None, machine: str | None = None) -> bool:
    """True on x86-64 CPUs without VNNI (avx512_vnni / avx_vnni).

    There ONNX Runtime's U8S8 integer matrix products use vpmaddubsw, which adds pairs of u8 x s8 products
    into int16 and saturates; ONNX Runtime's quantization guide advises reduce_range (7-bit weights) on such
    machines. Seen here: bert-tiny's dynamic INT8 outputs were off by 0.056 on an AVX2-only AMD EPYC with
    8-bit weights and within the 0.05 gate with 7-bit ones (0.006 with 8-bit weights on the earlier CI machine).
    """
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64"):
        return False
    if cpu_flags is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as info:
                line = next((l for l in info if l.startswith("flags")), "")
        except OSError:
            return False  # unknown: keep ORT's default
        cpu_flags = set(line.split(":", 1)[-1].split())
    return not ({"avx512_vnni", "avx_vnni"} & cpu_flags)


def quantized_node_count(proto: onnx.ModelProto) -> dict[str, int]:
    """QuantizeLinear / DequantizeLinear / integer-op counts, for the report."""
    ops = [n.op_type for n in proto.graph.node]
    names = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
             "QLinearConv", "QLinearMatMul", "QAttention")
    return {name: ops.count(name) for name in names if name in ops}


def nothing_quantized(proto: onnx.ModelProto, mode: str, ops: list[str], source: str) -> ModelError:
    """The error for an INT8 mode that would leave every node in float (never a silent FP32 "INT8" model)."""
    counts = Counter(n.op_type for n in proto.graph.node)
    heavy = [op for op in ("Conv", "ConvTranspose", "MatMul", "Gemm", "Attention") if counts[op]]
    have = ", ".join(f"{counts[op]} {op}" for op in heavy) or f"{len(proto.graph.node)} node(s), none of them " \
        "Conv/MatMul/Gemm"
    if mode == "dynamic":
        convs = counts["Conv"] + counts["ConvTranspose"]
        lead = (f"0 of {convs} Conv nodes are quantizable by dynamic INT8" if convs else
                "No node is quantizable by dynamic INT8")
        return ModelError(
            f"{lead} (it quantizes {'/'.join(ops)}; the model has {have}): INT8 would change nothing.",
            f"Use static INT8, which quantizes Conv with calibration data: onnxaccel optimize {source} -o "
            "model.int8.onnx --int8 static --calibration DATA (then run that file); or run in fp32/fp16.",
        )
    return ModelError(
        f"Static INT8 quantized no node (the model has {have}"
        + (f"; asked for {'/'.join(ops)}" if ops else "") + "): INT8 would change nothing.",
        "Check --int8-exclude (it may exclude every quantizable node), or run in fp32/fp16.",
    )


def import_quantization():
    """``onnxruntime.quantization`` (with its shape_inference module), or the error naming the extra to install."""
    try:
        import onnxruntime.quantization as q
        import onnxruntime.quantization.shape_inference  # noqa: F401 - used through q.shape_inference
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "cpu", "INT8 quantization") from exc
    return q


def quantize_error(what: str, exc: Exception, alternative: str) -> ModelError:
    """The quantizer's failure as a ModelError: its first line, and how to work around it (``alternative``)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ModelError(f"{what} failed: {first}",
                      f"Exclude the node it names with --int8-exclude NODE, {alternative}; --debug shows the "
                      "quantizer's full error.", details=repr(exc))


class QuietQuantizer:
    """The quantizer logs progress through the root logger and prints histogram progress to stdout
    (calibrate.py, Entropy/Percentile); keep both off the user's screen and out of --json output."""

    def __enter__(self):
        self.level = logging.root.level
        logging.root.setLevel(logging.ERROR)
        self.stdout = contextlib.redirect_stdout(io.StringIO())
        self.stdout.__enter__()

    def __exit__(self, *exc):
        self.stdout.__exit__(*exc)
        logging.root.setLevel(self.level)


def _check_per_channel_opset(proto: onnx.ModelProto) -> None:
    """Per-channel weights need DequantizeLinear's ``axis`` (opset 13); an older model is refused with the way out."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_QDQ_OPSET:
        raise ModelError(
            f"Per-channel INT8 needs opset >= {MIN_QDQ_OPSET} (DequantizeLinear's axis attribute); the model has "
            f"opset {opset}.",
            "Upgrade it first (onnxaccel.transform.int8.upgrade_for_qdq, or `onnxaccel optimize --opset 13`), or "
            "quantize per tensor.",
        )
