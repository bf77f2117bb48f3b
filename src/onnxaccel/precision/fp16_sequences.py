"""Sequence inputs and outputs stay float32 in an FP16 model, as tensor ones do with ``keep_io_types``.

ONNX Runtime's converter (``onnxruntime.transformers.float16.convert_float_to_float16``, microsoft/onnxruntime
onnxruntime/python/tools/transformers/float16.py, release 1.32.0) casts only tensor graph inputs and outputs;
:func:`cast_sequence_io` adds the element-wise casts for ``seq(float)`` ones (used by
:mod:`onnxaccel.precision.fp16`).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx


def _float_sequence(value: onnx.ValueInfoProto, elem_type: int) -> bool:
    """Whether ``value`` is a sequence of ``elem_type`` tensors."""
    seq = value.type.sequence_type if value.type.HasField("sequence_type") else None
    return bool(seq and seq.elem_type.HasField("tensor_type") and seq.elem_type.tensor_type.elem_type == elem_type)


def cast_sequence_io(original: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """Keep sequence-of-float graph inputs and outputs float32, as ``keep_io_types`` does for tensors.

    The converter casts only tensor inputs/outputs and retypes a ``seq(float)`` input or output to
    ``seq(float16)``, which changes what the caller must feed or gets back (SplitToSequence, SequenceMap
    models). There is no Cast for sequences, so each such input/output gets a Loop that casts element by
    element (SequenceAt -> Cast -> SequenceInsert; Loop carries sequences since opset 11, as do the sequence
    ops themselves), and its declared type is float again.
    """
    before = {v.name: v for v in list(original.graph.input) + list(original.graph.output)}
    graph = converted.graph
    taken = {n.name for n in graph.node} | {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    to_half, to_float = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    front: list[onnx.NodeProto] = []
    for value in graph.input:
        if _float_sequence(value, to_half) and _float_sequence(before.get(value.name, value), to_float):
            inner = fresh(f"{value.name}_fp16")
            _rename_uses(graph, value.name, inner)
            front += _sequence_cast_nodes(value.name, inner, to_half, fresh)
            value.type.sequence_type.elem_type.tensor_type.elem_type = to_float
    back: list[onnx.NodeProto] = []
    for value in graph.output:
        if _float_sequence(value, to_half) and _float_sequence(before.get(value.name, value), to_float):
            inner = fresh(f"{value.name}_fp16")
            for node in graph.node:
                node.output[:] = [inner if o == value.name else o for o in node.output]
            _rename_uses(graph, value.name, inner)
            back += _sequence_cast_nodes(inner, value.name, to_float, fresh)
            value.type.sequence_type.elem_type.tensor_type.elem_type = to_float
    if front or back:
        nodes = front + list(graph.node) + back
        del graph.node[:]
        graph.node.extend(nodes)


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Make every node of ``graph`` and of its subgraphs (Loop/If/Scan bodies read outer names) read ``new``."""
    for node in graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                _rename_uses(sub, old, new)


def _sequence_cast_nodes(source: str, target: str, to: int, fresh: Callable[[str], str]) -> list[onnx.NodeProto]:
    """Nodes computing ``target`` = every tensor of sequence ``source`` cast to ``to``."""
    helper = onnx.helper
    count, empty = fresh(f"{target}_length"), fresh(f"{target}_empty")
    body = helper.make_graph(
        [helper.make_node("SequenceAt", [source, "i"], ["item"]),
         helper.make_node("Cast", ["item"], ["item_cast"], to=to),
         helper.make_node("SequenceInsert", ["acc_in", "item_cast"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        f"{target}_cast_body",
        [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("acc_in", to, None)],
        [helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("acc_out", to, None)],
    )
    return [helper.make_node("SequenceLength", [source], [count], name=fresh(f"{target}_length_node")),
            helper.make_node("SequenceEmpty", [], [empty], dtype=to, name=fresh(f"{target}_empty_node")),
            helper.make_node("Loop", [count, "", empty], [target], body=body, name=fresh(f"{target}_cast_loop"))]
