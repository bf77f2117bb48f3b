"""The FLOP/MAC rules of flops.py: one function per op family, and the (domain, op) -> rule table.

flops.py's docstring states the counting conventions these rules follow (fvcore's and onnx-tool's).
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
    """The cost of one node: multiply-accumulates, and FLOPs (2 per MAC plus the other arithmetic)."""

    macs: int
    flops: int


@dataclass(frozen=True)
class NodeShapes:
    """The node, and the shapes of its inputs and outputs (None where unknown or absent)."""

    node: onnx.NodeProto
    inputs: tuple[MaybeShape, ...]
    outputs: tuple[MaybeShape, ...]

    def attr(self, name: str, default=None):
        """The node's attribute ``name`` as a Python value, or ``default`` when the node does not set it."""
        for a in self.node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def has_input(self, index: int) -> bool:
        """Whether the optional input at ``index`` is given (present and not the empty name)."""
        return len(self.node.input) > index and bool(self.node.input[index])


def numel(shape: Sequence[int]) -> int:
    """Number of elements of a shape (1 for a scalar)."""
    return math.prod(shape)


# -- multiply-accumulate ops --------------------------------------------------------------------------

def _conv_macs(w: MaybeShape, y: MaybeShape) -> int | None:
    if w is None or y is None or len(w) < 3:
        return None
    # Weight [M, C/group, k1, k2, ...]: each output element sums C/group * prod(k) products.
    return numel(y) * w[1] * numel(w[2:])


def _conv(s: NodeShapes) -> NodeCost | None:
    y = _get(s.outputs, 0)
    macs = _conv_macs(_get(s.inputs, 1), y)
    if macs is None:
        return None
    return NodeCost(macs, 2 * macs + (numel(y) if s.has_input(2) else 0))


def _conv_integer(s: NodeShapes) -> NodeCost | None:
    """ConvInteger (x, w, x_zero_point, w_zero_point): Conv's MACs, no bias."""
    macs = _conv_macs(_get(s.inputs, 1), _get(s.outputs, 0))
    return None if macs is None else NodeCost(macs, 2 * macs)


def _qlinear_conv(s: NodeShapes) -> NodeCost | None:
    """QLinearConv (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B): Conv's MACs, bias, requantization."""
    y = _get(s.outputs, 0)
    macs = _conv_macs(_get(s.inputs, 3), y)
    if macs is None:
        return None
    return NodeCost(macs, 2 * macs + (numel(y) if s.has_input(8) else 0) + _REQUANTIZE * numel(y))


def _deform_conv(s: NodeShapes) -> NodeCost | None:
    """DeformConv (X, W, offset, B, mask): Conv's MACs plus bilinear sampling of every input value it reads."""
    w, y = _get(s.inputs, 1), _get(s.outputs, 0)
    macs = _conv_macs(w, y)
    if macs is None or len(y) != len(w):
        return None
    kernel_points = numel(w[2:])
    channels = w[1] * (s.attr("group", 1) or 1)
    # im2col of the deformed positions: one sample per (batch, channel, kernel point, output position), shared
    # by every output channel; each is a weighted sum of the 2^d neighbours around a fractional position.
    samples = (numel(y) // y[1] if y[1] else 0) * channels * kernel_points
    interpolation = samples * 2 ** (len(w) - 2)
    flops = 2 * (macs + interpolation) + (numel(y) if s.has_input(3) else 0) + (samples if s.has_input(4) else 0)
    return NodeCost(macs + interpolation, flops)


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
    # Every output element is a dot product of length K: a[-1], or a[-2] when com.microsoft FusedMatMul /
    # TransposeMatMul transpose A (transA=1).
    k = a[-2] if s.attr("transA", 0) and len(a) >= 2 else a[-1]
    macs = numel(y) * k
    return NodeCost(macs, 2 * macs)


def _qlinear_matmul(s: NodeShapes) -> NodeCost | None:
    """QLinearMatMul (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp): MatMul's MACs plus requantization."""
    a, y = _get(s.inputs, 0), _get(s.outputs, 0)
    if a is None or y is None or not a:
        return None
    macs = numel(y) * a[-1]
    return NodeCost(macs, 2 * macs + _REQUANTIZE * numel(y))


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
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(s.node.input) or any(shape is None for shape in s.inputs):
        return None
    sizes: dict[str, int] = {}
    widest = 0  # most dimensions any operand's ellipsis stands for
    for term, shape in zip(terms, s.inputs):
        if "..." in term:
            covered = len(shape) - (len(term) - 3)
            if covered < 0:
                return None
            # Ellipsis dimensions broadcast right-aligned (numpy.einsum): name them from the right.
            term = term.replace("...", "".join(_ELLIPSIS[len(_ELLIPSIS) - covered:]))
            widest = max(widest, covered)
        if len(term) != len(shape):
            return None
        for label, size in zip(term, shape):
            sizes[label] = max(sizes.get(label, 1), size)  # a 1 broadcasts against n
    ellipsis = "".join(_ELLIPSIS[len(_ELLIPSIS) - widest:])
    if arrow:
        out = rhs.replace("...", ellipsis)
    else:  # implicit output: the ellipsis, then the labels used once, in alphabetical order (ONNX Einsum spec)
        once = [c for c in sorted(set(lhs) - {".", ","}) if lhs.count(c) == 1]
        out = ellipsis + "".join(once)
    points = numel(sizes.values())
    summed = set(sizes) - set(out)
    if len(terms) == 1:  # a reduction (one add per input point), or a transpose/diagonal (data movement)
        return NodeCost(0, points if summed else 0)
    products = (len(terms) - 1) * points  # naive evaluation: n - 1 multiplies per point of the joint space
    return NodeCost(products, 2 * products) if summed else NodeCost(0, products)


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


def _attention_gqa_guard(s: NodeShapes) -> NodeCost | None:
    """com.microsoft GroupQueryAttention: like Attention when key and value are separate inputs."""
    if not (s.has_input(1) and s.has_input(2)):
        return None  # packed QKV: the split is not in the shapes
    return _attention(s)


#: Gates of each recurrent op, and the element-wise FLOPs of its cell per hidden unit and time step.
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_CELL_FLOPS = {"RNN": 1, "GRU": 8, "LSTM": 9}


def _recurrent(s: NodeShapes) -> NodeCost | None:
    """RNN/GRU/LSTM (X, W, R, B, sequence_lens, initial_h[, initial_c, P]); see the module docstring."""
    x, w = _get(s.inputs, 0), _get(s.inputs, 1)
    if x is None or w is None or len(x) != 3 or len(w) != 3:
        return None
    op = s.node.op_type
    gates = _GATES[op]
    directions, gate_rows, input_size = w  # W [num_directions, gates * hidden_size, input_size]
    hidden = s.attr("hidden_size", 0) or gate_rows // gates
    seq, batch = (x[1], x[0]) if s.attr("layout", 0) else (x[0], x[1])
    steps = directions * seq * batch
    macs = steps * gates * hidden * (input_size + hidden)
    per_step = _CELL_FLOPS[op] * hidden + (2 * gates * hidden if s.has_input(3) else 0)
    if op == "LSTM" and s.has_input(7):
        per_step += 6 * hidden  # peepholes: P * Ct-1 added to the i and f gates, P * Ct to o
    return NodeCost(macs, 2 * macs + steps * per_step)


def _lrn(s: NodeShapes) -> NodeCost | None:
    """LRN: per element, the squares and sum over ``size`` channels, then bias, power and division."""
    y = _get(s.outputs, 0)
    return None if y is None else NodeCost(0, numel(y) * (2 * int(s.attr("size", 1)) + 3))


def _grid_sample(s: NodeShapes) -> NodeCost | None:
    """GridSample: 2^d MACs per output element for (bi/tri)linear, 4^d for cubic, an index for nearest."""
    y = _get(s.outputs, 0)
    if y is None or len(y) < 3:
        return None
    mode = s.attr("mode", b"linear")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    spatial = len(y) - 2
    neighbours = {"nearest": 0, "cubic": 4 ** spatial, "bicubic": 4 ** spatial}.get(mode, 2 ** spatial)
    macs = numel(y) * neighbours
    return NodeCost(macs, 2 * macs + numel(y) * spatial)  # plus un-normalizing the grid coordinates


def _embed_layer_norm(s: NodeShapes) -> NodeCost | None:
    """com.microsoft EmbedLayerNormalization: word + position (+ segment) embeddings, then LayerNormalization."""
    y = _get(s.outputs, 0)
    adds = 2 if s.has_input(1) and s.has_input(4) else 1  # segment_ids and segment_embedding given
    return None if y is None else NodeCost(0, numel(y) * (adds + _PER_ELEMENT["LayerNormalization"]))


def _scatter(s: NodeShapes) -> NodeCost | None:
    """ScatterElements/ScatterND: data movement, or one FLOP per update with reduction add/mul/max/min."""
    reduction = s.attr("reduction", b"none")
    reduction = reduction.decode() if isinstance(reduction, bytes) else str(reduction)
    if reduction == "none":
        return NodeCost(0, 0)
    updates = _get(s.inputs, 2)
    return None if updates is None else NodeCost(0, numel(updates))


def _control_flow(s: NodeShapes) -> NodeCost | None:
    """If/Loop/Scan/SequenceMap: free when their bodies only move data, else not countable from shapes."""
    return NodeCost(0, 0) if not _does_arithmetic_inside(s.node) else None


def _does_arithmetic_inside(node: onnx.NodeProto) -> bool:
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for inner in g.node:
                if op_key(inner) not in ZERO_COST or _does_arithmetic_inside(inner):
                    return True
    return False


# -- per-element ops -----------------------------------------------------------------------------------

_ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Erf",
    "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
    "Softplus", "Softsign", "Gelu", "FastGelu", "BiasGelu", "Mish", "Swish", "QuickGelu", "Sin", "Cos",
    "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Floor", "Ceil", "Round", "Sign", "Clip", "ThresholdedRelu",
    "Where", "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor",
    "IsNaN", "IsInf", "BiasAdd", "Shrink", "Acosh", "Asinh", "Atanh", "BitShift", "BitwiseAnd", "BitwiseNot",
    "BitwiseOr", "BitwiseXor", "BlackmanWindow", "HammingWindow", "HannWindow", "ScaledSiLU",
})
_VARIADIC = frozenset({"Sum", "Max", "Min", "Mean"})
_PER_ELEMENT = {
    "BatchNormalization": 2, "InstanceNormalization": 5, "GroupNormalization": 5, "LayerNormalization": 5,
    "SimplifiedLayerNormalization": 4, "SkipLayerNormalization": 6, "SkipSimplifiedLayerNormalization": 5,
    "RMSNormalization": 4, "LpNormalization": 3, "Softmax": 3, "LogSoftmax": 4, "DequantizeLinear": 2,
    "QuantizeLinear": 3, "Resize": 1, "Upsample": 1, "DepthToSpace": 0,
    "MeanVarianceNormalization": 5, "GroupNorm": 5, "SkipGroupNorm": 6, "BiasSoftmax": 4,
    # min and max over the tensor, then scale, round and shift (ONNX DynamicQuantizeLinear spec)
    "DynamicQuantizeLinear": 5,
    # x * cos + rotate_half(x) * sin (ONNX 23 and com.microsoft RotaryEmbedding)
    "RotaryEmbedding": 3,
}
#: Requantization of a QLinear op's int32 accumulator: multiply by the combined scale, add the zero point.
_REQUANTIZE = 2
# Ellipsis dimensions of Einsum get labels no equation uses (ONNX allows only letters there).
_ELLIPSIS = tuple(chr(0x100 + i) for i in range(32))
_REDUCE = frozenset({
    "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
    "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax",
    "ArgMin", "CumSum", "CumProd", "TopK", "Hardmax",  # selections: one comparison per input element
})

#: Ops that do no arithmetic: data movement, shapes, indexing, generation, strings, sequences. Every op outside
#: this set and without a rule in RULES is reported as uncounted, never as 0 FLOPs.
ZERO_COST = frozenset({("", op) for op in (
    "Cast", "CastLike", "BitCast", "CenterCropPad", "Compress", "Concat", "ConcatFromSequence", "Constant",
    "ConstantOfShape", "Dropout", "Expand", "EyeLike", "Flatten", "Gather", "GatherElements", "GatherND",
    "Identity", "MaxUnpool", "NonZero", "OneHot", "Optional", "OptionalGetElement", "OptionalHasElement", "Pad",
    "Range", "Reshape", "ReverseSequence", "Scatter", "SequenceAt", "SequenceConstruct", "SequenceEmpty",
    "SequenceErase", "SequenceInsert", "SequenceLength", "Shape", "Size", "Slice", "SpaceToDepth", "Split",
    "SplitToSequence", "Squeeze", "StringConcat", "StringNormalizer", "StringSplit", "RegexFullMatch",
    "TensorScatter", "Tile", "Transpose", "Trilu", "Unique", "Unsqueeze", "RandomNormal", "RandomNormalLike",
    "RandomUniform", "RandomUniformLike", "Bernoulli",
)} | {("com.microsoft", op) for op in (
    "ExpandDims", "GatherND", "Pad", "Range", "Trilu", "Unique", "RemovePadding", "RestorePadding",
    "TorchEmbedding", "Tokenizer", "MurmurHash3",
)} | {("ai.onnx.ml", op) for op in (
    "ArrayFeatureExtractor", "CastMap", "CategoryMapper", "DictVectorizer", "FeatureVectorizer", "LabelEncoder",
    "OneHotEncoder", "ZipMap",
)} | {("com.microsoft.nchwc", "ReorderInput"), ("com.microsoft.nchwc", "ReorderOutput")})


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
    ("", "ConvInteger"): _conv_integer, ("", "QLinearConv"): _qlinear_conv,
    ("com.microsoft", "QLinearConv"): _qlinear_conv, ("", "DeformConv"): _deform_conv,
    ("com.microsoft.nchwc", "Conv"): _conv, ("com.microsoft", "NhwcFusedConv"): _conv,
    ("", "MatMul"): _matmul, ("com.microsoft", "FusedMatMul"): _matmul, ("", "MatMulInteger"): _matmul,
    ("com.microsoft", "TransposeMatMul"): _matmul, ("com.microsoft", "MatMulInteger16"): _matmul,
    ("com.microsoft", "MatMulIntegerToFloat"): _matmul, ("com.microsoft", "DynamicQuantizeMatMul"): _matmul,
    ("com.microsoft", "MatMulNBits"): _matmul, ("com.microsoft", "MatMulBnb4"): _matmul,
    ("com.microsoft", "MatMulFpQ4"): _matmul, ("", "QLinearMatMul"): _qlinear_matmul,
    ("", "Gemm"): _gemm, ("com.microsoft", "FusedGemm"): _gemm, ("", "Einsum"): _einsum,
    ("com.microsoft", "Attention"): _attention_contrib,
    ("com.microsoft", "MultiHeadAttention"): _attention, ("", "Attention"): _attention,
    ("com.microsoft", "GroupQueryAttention"): _attention_gqa_guard,
    ("", "RNN"): _recurrent, ("", "GRU"): _recurrent, ("", "LSTM"): _recurrent,
    ("", "MaxPool"): _pool, ("", "AveragePool"): _pool, ("", "LpPool"): _pool,
    ("com.microsoft", "NhwcMaxPool"): _pool, ("com.microsoft.nchwc", "MaxPool"): _pool,
    ("com.microsoft.nchwc", "AveragePool"): _pool, ("com.microsoft.nchwc", "GlobalAveragePool"): _reduce,
    ("com.microsoft.nchwc", "GlobalMaxPool"): _reduce,
    ("", "LRN"): _lrn, ("", "GridSample"): _grid_sample, ("com.microsoft", "GridSample"): _grid_sample,
    ("com.microsoft", "EmbedLayerNormalization"): _embed_layer_norm,
    ("", "ScatterElements"): _scatter, ("", "ScatterND"): _scatter,
    ("", "If"): _control_flow, ("", "Loop"): _control_flow, ("", "Scan"): _control_flow,
    ("", "SequenceMap"): _control_flow,
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
                    if rule in (_conv, _conv_transpose, _matmul, _gemm, _einsum, _attention, _attention_contrib,
                                _conv_integer, _qlinear_conv, _qlinear_matmul, _deform_conv, _recurrent,
                                _attention_gqa_guard))
#: Ops with subgraphs whose bodies run data-dependently.
CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})



def op_key(node: onnx.NodeProto) -> tuple[str, str]:
    """(domain, op type) with "ai.onnx" spelled "", the key of ``RULES`` and ``ZERO_COST``."""
    return (node.domain if node.domain not in ("", "ai.onnx") else "", node.op_type)


def _get(shapes: tuple[MaybeShape, ...], index: int) -> MaybeShape:
    return shapes[index] if index < len(shapes) else None
