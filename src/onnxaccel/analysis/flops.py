"""FLOPs and MACs of one ONNX node, from its attributes and the shapes of its inputs and outputs.

Conventions (those of fvcore and onnx-tool, so numbers compare with published ones):

* 1 MAC (multiply-accumulate) = 2 FLOPs. Conv, ConvTranspose, Gemm, MatMul, Einsum and attention count
  MACs; ResNet-50 at 224x224 is ~4.1 GMACs = ~8.2 GFLOPs.
* A bias add counts one FLOP per output element; Gemm's ``beta * C`` likewise.
* Element-wise ops count one FLOP per output element (``Sum``/``Max``/``Min``/``Mean`` of n inputs: n - 1).
* Normalizations and Softmax count a fixed number of FLOPs per element (the table ``_PER_ELEMENT`` in flops_rules):
  BatchNormalization 2 (scale and shift, statistics are constants at inference), Softmax 3 (exp, sum,
  divide), LayerNormalization 5 (mean, subtract, variance, normalize, scale and shift). com.microsoft
  EmbedLayerNormalization adds the embeddings first: 1 more per element (word + position), 2 with segments.
* Pooling counts one FLOP per window element per output; global pooling and reductions one per input.
* Data movement (Reshape, Transpose, Gather, Concat, Slice, Cast, ...) is 0 FLOPs, and so is every op in
  ``ZERO_COST``: that set is explicit, so an op nobody classified is never taken for free.
* Recurrent ops (RNN, GRU, LSTM; formulas of the ONNX operator spec, onnx/onnx docs/Operators.md, 1.23):
  per direction, time step and batch row, the gates cost ``gates * hidden * (input + hidden)`` MACs (``Xt W^T``
  and ``Ht-1 R^T`` as one dot product of length input + hidden), plus ``2 * gates * hidden`` FLOPs of bias
  adds when ``B`` is given, plus the element-wise work of the cell: RNN 1 per hidden unit (activation), GRU 8
  (3 activations, the reset product, ``(1 - z) h + z Ht-1``), LSTM 9 (4 activations, ``f Ct-1 + i c``,
  ``o h(Ct)``) and 6 more with peepholes. Steps count the full sequence length (``sequence_lens`` is data).
* Integer and quantized ops count like their float twins (ConvInteger = Conv, MatMulInteger = MatMul): the
  zero-point subtraction is folded into the integer accumulation and not counted; QLinearConv and
  QLinearMatMul add 2 FLOPs per output element for requantization (scale, zero point).
* DeformConv: the convolution's MACs plus bilinear sampling, 2^d MACs (4 in 2-D) per sampled input value
  (batch * channels * kernel points * output positions), plus one FLOP per sample for the mask.
* Einsum: a contraction of n operands costs (n - 1) MACs per point of the joint index space (ellipsis and
  implicit output included); products without a summed index cost (n - 1) FLOPs per point.
* If/Loop/Scan/SequenceMap: not counted (their bodies run data-dependently) unless the bodies do no arithmetic.

A rule returns None when a shape it needs is unknown; an op with no rule and not in ``ZERO_COST`` has no
cost either. The caller reports such nodes as uncounted, with ``uncounted_reason``, and the total as partial.
The rules themselves (one function per op family, and the op -> rule table ``RULES``) are in flops_rules.
"""

from __future__ import annotations

import onnx

from onnxaccel.analysis.flops_rules import (  # noqa: F401 - graph_stats imports MAC_OPS, numel here
    CONTROL_FLOW, MAC_OPS, RULES, ZERO_COST, NodeCost, NodeShapes, numel, op_key,
)


def node_cost(shapes: NodeShapes) -> NodeCost | None:
    """FLOPs/MACs of one node; NodeCost(0, 0) for ops in ZERO_COST; None when the node does arithmetic that
    cannot be counted (a needed shape is unknown, no rule for the op, a control-flow body): see
    :func:`uncounted_reason`."""
    key = op_key(shapes.node)
    if key in ZERO_COST:
        return NodeCost(0, 0)
    rule = RULES.get(key)
    return None if rule is None else rule(shapes)


def uncounted_reason(node: onnx.NodeProto) -> str:
    """Why :func:`node_cost` gave None for this node."""
    key = op_key(node)
    if key not in RULES:
        return "no FLOP rule for this op"
    if key[0] == "" and node.op_type in CONTROL_FLOW:
        return "control flow: its body runs data-dependently"
    return "a shape it needs is unknown"


def is_counted_op(node: onnx.NodeProto) -> bool:
    """True when the op has a FLOP rule or is known to do no arithmetic."""
    return op_key(node) in RULES or op_key(node) in ZERO_COST

