"""FLOPs and MACs of one ONNX node, from its attributes and the shapes of its inputs and outputs.

Conventions (those of fvcore and onnx-tool, so numbers compare with published ones):

* 1 MAC (multiply-accumulate) = 2 FLOPs. Conv, ConvTranspose, Gemm, MatMul, Einsum and attention count
  MACs; ResNet-50 at 224x224 is ~4.1 GMACs = ~8.2 GFLOPs.
* A bias add counts one FLOP per output element; Gemm's ``beta * C`` likewise.
* Element-wise ops count one FLOP per output element (``Sum``/``Max``/``Min``/``Mean`` of n inputs: n - 1).
* Normalizations and Softmax count a fixed number of FLOPs per element (the table ``_PER_ELEMENT``):
  BatchNormalization 2 (scale and shift, statistics are constants at inference), Softmax 3 (exp, sum,
  divide), LayerNormalization 5 (mean, subtract, variance, normalize, scale and shift).
* Pooling counts one FLOP per window element per output; global pooling and reductions one per input.
* Data movement (Reshape, Transpose, Gather, Concat, Slice, Cast, ...) is 0 FLOPs.

A rule returns None when a shape it needs is unknown; the caller reports such nodes as uncounted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

Shape = tuple[int, ...]
MaybeShape = Shape | None


@dataclass(frozen=True)
class NodeCost:
    macs: int
    flops: int


@dataclass(frozen=True)
class NodeShapes:
    """The node, and the shapes of its inputs and outputs (None where unknown or absent)."""

    node: onnx.NodeProto
    inputs: tuple[MaybeShape, ...]
    outputs: tuple[MaybeShape, ...]

    def attr(self, name: str, default=None):
        for a in self.node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def has_input(self, index: int) -> bool:
        return len(self.node.input) > index and bool(self.node.input[index])


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


# -- multiply-accumulate ops --------------------------------------------------------------------------

def _conv(s: NodeShapes) -> NodeCost | None:
    w, y = _get(s.inputs, 1), _get(s.outputs, 0)
    if w is None or y is None or len(w) < 3:
        return None
    # Weight [M, C/group, k1, k2, ...]: each output element sums C/group * prod(k) products.
    macs = numel(y) * w[1] * numel(w[2:])
    return NodeCost(macs, 2 * macs + (numel(y) if s.has_input(2) else 0))


def _conv_transpose(s: NodeShapes) -> NodeCost | None:
    x, w, y = _get(s.inputs, 0), _get(s.inputs, 1), _get(s.outputs, 0)
    if x is None or w is None or y is None or len(w) < 3:
        return None
    # Weight [C, M/group, k...]: every input element is scattered into M/group * prod(k) outputs.
    macs = numel(x) * w[1] * numel(w[2:])
    return NodeCost(macs, 2 * macs + (numel(y) if s.has_input(2) else 0))


def _matmul(s: NodeShapes) -> NodeCost | None:
    a, y = _get(s.inputs, 0), _get(s.outputs, 0)
    if a is None or y is None or not a:
        return None
    macs = numel(y) * a[-1]  # every output element is a dot product of length K = a[-1]
    return NodeCost(macs, 2 * macs)


def _gemm(s: NodeShapes) -> NodeCost | None:
    a, y = _get(s.inputs, 0), _get(s.outputs, 0)
    if a is None or y is None or len(a) != 2:
        return None
    k = a[0] if s.attr("transA", 0) else a[1]
    macs = numel(y) * k
    return NodeCost(macs, 2 * macs + (numel(y) if s.has_input(2) else 0))


def _einsum(s: NodeShapes) -> NodeCost | None:
    equation = (s.attr("equation", b"") or b"")
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    lhs, _, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if "..." in equation or len(terms) != len(s.node.input):
        return None
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, s.inputs):
        if shape is None or len(shape) != len(term):
            return None
        sizes.update(zip(term, shape))
    summed = set(sizes) - set(rhs)
    if not summed or len(terms) < 2:
        return NodeCost(0, numel(_get(s.outputs, 0) or (1,)))
    macs = numel(sizes.values())  # one product per point of the joint index space
    return NodeCost(macs, 2 * macs)


def _attention_contrib(s: NodeShapes) -> NodeCost | None:
    """com.microsoft Attention: x [B, S, D] @ W [D, 3D] then softmax(QK^T) V."""
    x, w = _get(s.inputs, 0), _get(s.inputs, 1)
    if x is None or w is None or len(x) != 3:
        return None
    b, seq, hidden = x
    projection = b * seq * hidden * w[-1]
    attention = 2 * b * seq * seq * (w[-1] // 3)
    return NodeCost(projection + attention, 2 * (projection + attention))


def _attention(s: NodeShapes) -> NodeCost | None:
    """ai.onnx Attention (opset 23) and com.microsoft MultiHeadAttention: softmax(QK^T) V.

    Q [B, S, Hq*Dh] or [B, Hq, S, Dh]; K [B, L, ...]/[B, H, L, Dh]; V likewise. MACs = B*S*L*(Hq*Dh)
    for QK^T plus B*S*L*(Hq*Dv) for the product with V.
    """
    q, k, v = _get(s.inputs, 0), _get(s.inputs, 1), _get(s.inputs, 2)
    if q is None or k is None or v is None or len(q) not in (3, 4) or len(k) != len(q):
        return None
    if len(q) == 4:
        b, heads, seq, dq = q
        length, dv = k[2], v[3]
        macs = b * heads * seq * length * (dq + dv)
    else:
        b, seq, q_hidden = q
        length = k[1]
        q_heads = s.attr("q_num_heads", 0) or s.attr("num_heads", 0) or 1
        kv_heads = s.attr("kv_num_heads", 0) or q_heads
        macs = b * seq * length * (q_hidden + v[-1] * q_heads // kv_heads)
    return NodeCost(macs, 2 * macs)


# -- per-element ops -----------------------------------------------------------------------------------

_ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Erf",
    "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
    "Softplus", "Softsign", "Gelu", "FastGelu", "BiasGelu", "Mish", "Swish", "QuickGelu", "Sin", "Cos",
    "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Floor", "Ceil", "Round", "Sign", "Clip", "ThresholdedRelu",
    "Where", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor",
    "IsNaN", "IsInf", "BiasAdd", "Shrink",
})
_VARIADIC = frozenset({"Sum", "Max", "Min", "Mean"})
_PER_ELEMENT = {
    "BatchNormalization": 2, "InstanceNormalization": 5, "GroupNormalization": 5, "LayerNormalization": 5,
    "SimplifiedLayerNormalization": 4, "SkipLayerNormalization": 6, "SkipSimplifiedLayerNormalization": 5,
    "RMSNormalization": 4, "LpNormalization": 3, "Softmax": 3, "LogSoftmax": 4, "DequantizeLinear": 2,
    "QuantizeLinear": 3, "Resize": 1, "Upsample": 1, "DepthToSpace": 0,
}
_REDUCE = frozenset({
    "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
    "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax",
    "ArgMin", "CumSum",
})


def _elementwise(s: NodeShapes) -> NodeCost | None:
    y = _get(s.outputs, 0)
    return None if y is None else NodeCost(0, numel(y))


def _variadic(s: NodeShapes) -> NodeCost | None:
    y = _get(s.outputs, 0)
    return None if y is None else NodeCost(0, numel(y) * max(1, len(s.node.input) - 1))


def _per_element(s: NodeShapes) -> NodeCost | None:
    y = _get(s.outputs, 0)
    return None if y is None else NodeCost(0, numel(y) * _PER_ELEMENT[s.node.op_type])


def _reduce(s: NodeShapes) -> NodeCost | None:
    x = _get(s.inputs, 0)
    return None if x is None else NodeCost(0, numel(x))


def _pool(s: NodeShapes) -> NodeCost | None:
    y = _get(s.outputs, 0)
    kernel = s.attr("kernel_shape")
    return None if y is None or not kernel else NodeCost(0, numel(y) * numel(kernel))


RULES: dict[tuple[str, str], Callable[[NodeShapes], NodeCost | None]] = {
    ("", "Conv"): _conv, ("com.microsoft", "FusedConv"): _conv, ("com.microsoft", "NhwcConv"): _conv,
    ("", "ConvTranspose"): _conv_transpose,
    ("", "MatMul"): _matmul, ("com.microsoft", "FusedMatMul"): _matmul, ("", "MatMulInteger"): _matmul,
    ("", "Gemm"): _gemm, ("", "Einsum"): _einsum,
    ("com.microsoft", "Attention"): _attention_contrib,
    ("com.microsoft", "MultiHeadAttention"): _attention, ("", "Attention"): _attention,
    ("", "MaxPool"): _pool, ("", "AveragePool"): _pool, ("", "LpPool"): _pool,
}
for _op in _ELEMENTWISE:
    RULES.setdefault(("", _op), _elementwise)
    RULES.setdefault(("com.microsoft", _op), _elementwise)
for _op in _VARIADIC:
    RULES[("", _op)] = _variadic
for _op in _PER_ELEMENT:
    RULES.setdefault(("", _op), _per_element)
    RULES.setdefault(("com.microsoft", _op), _per_element)
for _op in _REDUCE:
    RULES[("", _op)] = _reduce

#: Ops whose MACs dominate a model; a missing shape for one of them is worth a warning.
MAC_OPS = frozenset(op for (_, op), rule in RULES.items()
                    if rule in (_conv, _conv_transpose, _matmul, _gemm, _einsum, _attention, _attention_contrib))


def node_cost(shapes: NodeShapes) -> NodeCost | None:
    """FLOPs/MACs of one node; NodeCost(0, 0) for ops that move data; None when a needed shape is unknown."""
    domain = shapes.node.domain if shapes.node.domain not in ("", "ai.onnx") else ""
    rule = RULES.get((domain, shapes.node.op_type))
    if rule is None:
        return NodeCost(0, 0)
    return rule(shapes)


def _get(shapes: tuple[MaybeShape, ...], index: int) -> MaybeShape:
    return shapes[index] if index < len(shapes) else None


def is_counted_op(node: onnx.NodeProto) -> bool:
    domain = node.domain if node.domain not in ("", "ai.onnx") else ""
    return (domain, node.op_type) in RULES

