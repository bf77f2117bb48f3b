"""INT8 quantization with ONNX Runtime's quantizer for `optimize`: static QDQ with calibration, or dynamic.

Dynamic quantization itself, the settings and the shared helpers live in :mod:`onnxaccel.precision.int8`
(`run -p int8` needs them below the pipeline); this module adds what only `optimize` does: calibrated static
QDQ, the opset upgrade for per-channel weights, and the float output tail.

Facts this module relies on (onnxruntime.quantization, ORT 1.32; ORT docs "Quantize ONNX models",
https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html):

* Static QDQ inserts QuantizeLinear/DequantizeLinear pairs whose scales come from calibration
  (MinMax, Entropy, Percentile); every execution provider reads QDQ, and compiling providers fuse the
  pairs into INT8 kernels (TensorRT; MIGraphX's ``simplify_qdq`` pass "inserts quantized operators in place
  of dq->quantizable_op->q", AMDMIGraphX src/include/migraphx/simplify_qdq.hpp).
* The docs recommend S8S8 (int8 activations and weights) with QDQ as the first choice, dynamic quantization
  for transformers and RNNs, static for CNNs; per-channel weights need opset >= 13 (DequantizeLinear's
  ``axis`` attribute arrived in opset 13: an opset-11 model fails with "Unrecognized attribute: axis for
  operator DequantizeLinear"), so older models are upgraded first.
* TensorRT needs symmetric activations (``ActivationSymmetric``); we set it for tensorrt and migraphx.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx

from onnxaccel import providers
from onnxaccel.precision.fp16 import PRECISION_KEY, set_metadata
from onnxaccel.precision.int8 import (
    DEFAULT_TENSOR_TYPE,
    DYNAMIC_OPS,
    MIN_QDQ_OPSET,
    Int8Settings,
    QuietQuantizer,
    import_quantization,
    nothing_quantized,
    quantize_dynamic,
    quantize_error,
    quantized_node_count,
)
from onnxaccel.calibration import CalibrationData
from onnxaccel.transform.opset import convert_opset, default_opset

#: ONNX Runtime's name for the CPU provider (from the registry: only providers/ and engines/ spell it).
_CPU = providers.get("cpu").provider

_TAIL_OPS = {"Softmax", "LogSoftmax", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"}


def output_tail(proto: onnx.ModelProto) -> list[str]:
    """Nodes between the last compute op and the graph outputs that only normalize or reshape (Softmax,
    Reshape, Flatten...).

    They are left in float: ORT's QDQ quantizer gives Softmax a fixed [0, 1] output range, so with int8 a
    probability below 1/254 rounds to 0 (a 1000-class model's near-uniform output became all zeros on
    zoo:squeezenet), and quantizing an output buys no speed.
    """
    producer = {out: n for n in proto.graph.node for out in n.output}
    tail: list[str] = []
    stack = [o.name for o in proto.graph.output]
    while stack:
        node = producer.get(stack.pop())
        if node is None or node.op_type not in _TAIL_OPS or node.name in tail:
            continue
        tail.append(node.name)
        stack.extend(node.input[:1])
    return tail


@dataclass
class StaticQuantization:
    """A static QDQ model, whether its weights are per channel, and what was changed from the settings asked."""

    proto: onnx.ModelProto
    per_channel: bool
    note: str | None = None


def quantize_static_proto(proto: onnx.ModelProto, data: CalibrationData, settings: Int8Settings) -> onnx.ModelProto:
    """Static QDQ quantization of ``proto`` (weights loaded, nodes named) calibrated on ``data``; the
    :func:`output_tail` stays float. See :func:`quantize_static_reported` for the per-tensor fallback."""
    return quantize_static_reported(proto, data, settings).proto


def quantize_static_reported(proto: onnx.ModelProto, data: CalibrationData,
                             settings: Int8Settings) -> StaticQuantization:
    """:func:`quantize_static_proto`, saying whether the weights ended up per channel.

    ONNX Runtime's per-channel bias check (qdq_quantizer.py ``_adjust_weight_scale_for_int32_bias``, 1.32)
    indexes the bias per output channel and fails on a bias that is not 1-D (a Gemm's C of shape [1, N]) with
    numpy's "The truth value of an array with more than one element is ambiguous". Per-tensor weights take
    another branch, so the model is quantized per tensor then, and the note names the nodes.
    """
    try:
        return StaticQuantization(_quantize_static(proto, data, settings), settings.per_channel)
    except _PerChannelBiasError as exc:
        nodes = bias_not_1d(proto)
        result = _quantize_static(proto, data, dataclasses.replace(settings, per_channel=False))
        named = f" ({', '.join(nodes[:5])}{' ...' if len(nodes) > 5 else ''})" if nodes else ""
        note = (f"weights quantized per tensor, not per channel: ONNX Runtime's per-channel quantizer fails on a bias "
                f"that is not 1-D{named} (\"{str(exc.__cause__).splitlines()[0][:80]}\"); --per-tensor does this "
                "directly")
        return StaticQuantization(result, False, note)


class _PerChannelBiasError(Exception):
    """The quantizer's numpy failure on a per-channel bias that is not 1-D (see quantize_static_reported)."""


def bias_not_1d(proto: onnx.ModelProto) -> list[str]:
    """Conv/Gemm nodes whose bias initializer is not 1-D (what the per-channel bias check cannot index)."""
    shapes = {t.name: len(t.dims) for t in proto.graph.initializer}
    return [n.name for n in proto.graph.node if n.op_type in ("Conv", "Gemm") and len(n.input) > 2
            and shapes.get(n.input[2], 1) != 1]


def _quantize_static(proto: onnx.ModelProto, data: CalibrationData, settings: Int8Settings) -> onnx.ModelProto:
    q = import_quantization()
    with tempfile.TemporaryDirectory(prefix="onnxaccel-int8-") as tmp:
        source = Path(tmp) / "model.onnx"
        onnx.save_model(upgrade_for_qdq(proto), str(source), save_as_external_data=proto.ByteSize() > 1_800_000_000)
        prepared = _preprocess(q, source, Path(tmp) / "pre.onnx")
        out = Path(tmp) / "int8.onnx"
        activation = q.QuantType.QInt8 if settings.activations == "int8" else q.QuantType.QUInt8
        extra = {"ActivationSymmetric": settings.symmetric_activations, "CalibPercentile": settings.percentile,
                 **DEFAULT_TENSOR_TYPE}
        method = {"minmax": q.CalibrationMethod.MinMax, "entropy": q.CalibrationMethod.Entropy,
                  "percentile": q.CalibrationMethod.Percentile}[settings.method]
        with QuietQuantizer():
            try:
                q.quantize_static(
                    str(prepared), str(out), data.reader(), quant_format=q.QuantFormat.QDQ,
                    op_types_to_quantize=list(settings.op_types) or None, per_channel=settings.per_channel,
                    activation_type=activation, weight_type=q.QuantType.QInt8,
                    nodes_to_exclude=sorted(set(settings.exclude_nodes) | set(output_tail(proto))) or None,
                    calibrate_method=method,
                    calibration_providers=[_CPU], extra_options=extra,
                    use_external_data_format=proto.ByteSize() > 1_800_000_000,
                )
            except ValueError as exc:
                if settings.per_channel and "truth value of an array" in str(exc):
                    raise _PerChannelBiasError() from exc
                raise quantize_error("Static INT8 quantization", exc, "or try --int8 dynamic") from exc
            except Exception as exc:  # noqa: BLE001 - the quantizer raises plain exceptions
                raise quantize_error("Static INT8 quantization", exc, "or try --int8 dynamic") from exc
        result = onnx.load(str(out))
    if not quantized_node_count(result):
        raise nothing_quantized(proto, "static", list(settings.op_types), "MODEL")
    set_metadata(result, PRECISION_KEY, f"int8-qdq-{settings.method}")
    return result


def quantize_dynamic_proto(proto: onnx.ModelProto, settings: Int8Settings | None = None, *,
                           source: str = "MODEL") -> onnx.ModelProto:
    """`optimize --int8 dynamic`: :func:`onnxaccel.precision.int8.quantize_dynamic`, a model that will get
    per-channel weights upgraded to opset 13 first (:func:`upgrade_for_qdq`)."""
    settings = settings or Int8Settings(mode="dynamic", per_channel=False)
    ops = settings.op_types or DYNAMIC_OPS
    if settings.per_channel and any(n.op_type in ops for n in proto.graph.node):
        proto = upgrade_for_qdq(proto)
    return quantize_dynamic(proto, settings, source=source)


def upgrade_for_qdq(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model at opset >= 13 (a copy converted with onnx.version_converter), or itself."""
    if default_opset(proto) >= MIN_QDQ_OPSET:
        return proto
    return convert_opset(proto, MIN_QDQ_OPSET)


def _preprocess(q, source: Path, dest: Path) -> Path:
    """ORT's quant_pre_process (ONNX shape inference + graph optimization); symbolic shape inference is
    skipped because it asserts on graphs it cannot follow (e.g. Paddle's Concat on axis != 0)."""
    try:
        with QuietQuantizer():
            q.shape_inference.quant_pre_process(str(source), str(dest), skip_symbolic_shape=True)
        return dest
    except Exception:  # noqa: BLE001 - preprocessing is an optimization; quantize the model as it is
        return source
