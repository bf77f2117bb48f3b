"""How much of a model INT8 quantization reached: the share of its FLOPs and of its weights now computed in
integers, for the optimize report.

A quantizer may change very little and still produce a valid "INT8" model: dynamic INT8 leaves Conv alone
(:mod:`onnxaccel.precision.int8`), so on a CNN it quantizes the classifier head alone. The report then states the
share, and :data:`LOW_FLOPS_SHARE` sets the share of FLOPs below which it warns.

Which nodes were quantized, by the names ONNX Runtime's quantizer gives (onnxruntime/python/tools/quantization,
1.32): the operator form (dynamic mode, QOperator) replaces node ``X`` with ``X_quant`` (MatMulInteger,
ConvInteger, QLinearConv...); the QDQ form keeps ``X`` and feeds it from DequantizeLinear nodes.

Counting FLOPs is ``analysis``' (a feature beside ``transform``), so the caller passes a :class:`FlopCounter`
in (``cli/optimize.py`` composes them, as it does the divergence finder); without one only weights are shared.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import onnx

from onnxaccel.model import Model
from onnxaccel.transform.evaluate import model_at

#: Below this share of the model's FLOPs computed in INT8, the report warns.
LOW_FLOPS_SHARE = 0.10
#: Ops whose cost is arithmetic on weights: the nodes a quantizer is meant to reach.
#: Integer ops the quantizer puts in place of a float node (operator form); QLinear* count too.
INTEGER_OPS = frozenset({"MatMulInteger", "ConvInteger", "QGemm", "QAttention", "DynamicQuantizeMatMul",
                         "MatMulIntegerToFloat", "DynamicQuantizeLSTM"})
COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Attention", "LSTM", "GRU", "RNN", "Einsum"})


class FlopCounter(Protocol):
    """``count(model) -> {node name: FLOPs}`` at the model's bound shapes (``analysis.graph_stats`` is one)."""

    def __call__(self, model: Model, /) -> dict[str, int]:
        """FLOPs per node of ``model``."""


@dataclass
class Int8Coverage:
    """The quantized nodes, their share of the FLOPs (None: not counted) and of the float weights.

    ``quantized`` is every node computed in integers (in QDQ form that includes the Add, Mul... fed from
    DequantizeLinear), and the shares are over them; ``quantized_compute`` is those of them among the
    ``compute_nodes`` (:data:`COMPUTE_OPS`), the population "N of M compute nodes" counts.
    """

    quantized: list[str]
    compute_nodes: int
    flops_share: float | None
    weights_share: float | None
    quantized_compute: list[str] = field(default_factory=list)

    @property
    def low(self) -> bool:
        """True when a counted share of FLOPs is below :data:`LOW_FLOPS_SHARE`."""
        return self.flops_share is not None and self.flops_share < LOW_FLOPS_SHARE

    def describe(self) -> str:
        """e.g. 'INT8 covers 0.01% of the FLOPs and 0.4% of the weights (1 of 54 compute nodes: Gemm_53)'."""
        flops = f"{_share(self.flops_share)} of the FLOPs" if self.flops_share is not None else "FLOPs not counted"
        weights = (f"{_share(self.weights_share)} of the weights" if self.weights_share is not None
                   else "no float weights")
        compute = self.quantized_compute
        names = ", ".join(compute[:3]) + (" ..." if len(compute) > 3 else "")
        others = len(self.quantized) - len(compute)
        return (f"INT8 covers {flops} and {weights} ({len(compute)} of {self.compute_nodes} compute nodes"
                + (f": {names}" if names else "")
                + (f"; {others} other node{'s' if others != 1 else ''} quantized" if others > 0 else "") + ")")

    def warning(self) -> str | None:
        """The report's warning when the FLOPs share is low, else None."""
        if not self.low:
            return None
        return (f"{self.describe()}: the model is labelled INT8 but almost all of its arithmetic stays in float. "
                "Dynamic INT8 quantizes MatMul/Gemm only; for a CNN use --int8 static --calibration DATA, or run "
                "it in fp32/fp16.")

    def to_dict(self) -> dict:
        """JSON-ready form (shares as fractions 0..1)."""
        return {"quantized_nodes": self.quantized, "quantized_compute_nodes": self.quantized_compute,
                "compute_nodes": self.compute_nodes,
                "flops_share": self.flops_share, "weights_share": self.weights_share,
                "low_flops_share_threshold": LOW_FLOPS_SHARE, "low": self.low, "summary": self.describe()}


def _share(value: float) -> str:
    """A share as a percentage, a tiny non-zero one as '<0.01%' rather than '0.00%'."""
    return "<0.01%" if 0 < value < 1e-4 else f"{value:.2%}"


def int8_coverage(before: onnx.ModelProto, after: onnx.ModelProto, bound: Model,
                  count_flops: FlopCounter | None = None) -> Int8Coverage:
    """What of ``before`` (the float graph the quantizer was given, nodes named) ``after`` computes in INT8."""
    quantized = quantized_nodes(before, after)
    compute = [n.name for n in before.graph.node if n.op_type in COMPUTE_OPS]
    compute_names = set(compute)
    return Int8Coverage(quantized, len(compute), _flops_share(before, bound, quantized, count_flops),
                        _weights_share(before, set(quantized)),
                        [name for name in quantized if name in compute_names])


def quantized_nodes(before: onnx.ModelProto, after: onnx.ModelProto) -> list[str]:
    """Nodes of ``before`` that ``after`` computes in integers: replaced by an integer node named after them
    (``X_quant``, or ``X_MatMul_quant`` where the quantizer split a Gemm into MatMul + Add first), or fed from
    DequantizeLinear (QDQ)."""
    replaced: set[str] = set()
    for node in after.graph.node:
        if node.op_type in INTEGER_OPS or node.op_type.startswith("QLinear"):
            name = node.name[: -len("_quant")] if node.name.endswith("_quant") else node.name
            replaced.add(name)
            # A Gemm split into MatMul + Add first (onnxruntime/quantization/onnx_model.py, 1.32: "_MatMul").
            if name.endswith("_MatMul"):
                replaced.add(name[: -len("_MatMul")])
    dequantized = {out for n in after.graph.node if n.op_type == "DequantizeLinear" for out in n.output}
    fed = {n.name for n in after.graph.node if n.op_type != "DequantizeLinear" and any(
        i in dequantized for i in n.input)}
    return [n.name for n in before.graph.node
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and (n.name in replaced or n.name in fed)]


def _flops_share(before: onnx.ModelProto, bound: Model, quantized: list[str],
                 count_flops: FlopCounter | None) -> float | None:
    if count_flops is None:
        return None
    with tempfile.TemporaryDirectory(prefix="onnxaccel-int8-flops-") as tmp:
        path = Path(tmp) / "float.onnx"
        onnx.save_model(before, str(path), save_as_external_data=before.ByteSize() > 1_800_000_000)
        try:
            flops = count_flops(model_at(path, bound))
        except Exception:  # noqa: BLE001 - counting is a report detail; the share is then not given
            return None
    total = sum(flops.values())
    return sum(flops.get(name, 0) for name in quantized) / total if total else None


def _weights_share(before: onnx.ModelProto, quantized: set[str]) -> float | None:
    """Float initializer elements read by quantized nodes, over all float initializer elements."""
    sizes = {}
    for t in before.graph.initializer:
        if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
            count = 1
            for dim in t.dims:
                count *= dim
            sizes[t.name] = count
    total = sum(sizes.values())
    if not total:
        return None
    read = {name for n in before.graph.node if n.name in quantized for name in n.input if name in sizes}
    return sum(sizes[name] for name in read) / total
