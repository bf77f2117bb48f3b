"""What a model is made of, for the shapes it is bound to: ops, parameters, FLOPs/MACs per node, activations.

Shapes come from shape inference (ONNX Runtime's symbolic shape inference, else ONNX's own with data
propagation) on a light copy of the graph whose inputs carry the bound shapes and whose large weights are
replaced by typed inputs: the weights' values are never read, so a 400 MB model costs a few MB here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from onnxaccel.analysis.flop_coverage import FlopCoverage, flop_coverage
from onnxaccel.analysis.flops import MAC_OPS, NodeShapes, node_cost, numel, uncounted_reason
from onnxaccel.model import Model

#: Initializers up to this many elements keep their values for shape inference (Reshape targets, axes).
_KEEP_VALUES_UP_TO = 4096

# Bits per element of the sub-byte types, which numpy cannot size (onnx.proto3: INT4/UINT4 packed two per
# byte, FLOAT4E2M1 likewise, INT2/UINT2 four per byte).
_SUB_BYTE_BITS = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}


@dataclass(frozen=True)
class NodeStats:
    """Static cost of one node for the bound shapes: output shapes, MACs, FLOPs and parameters."""
    index: int
    name: str
    op_type: str
    domain: str
    output_shapes: tuple[tuple[int, ...] | None, ...]
    macs: int
    flops: int
    params: int
    #: False when the op does arithmetic that could not be counted; macs and flops are then 0 and
    #: ``uncounted_reason`` says why (a shape is unknown, no rule for the op, a control-flow body).
    counted: bool = True
    uncounted_reason: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready form of the node's statistics."""
        return {
            "index": self.index, "name": self.name, "op_type": self.op_type, "domain": self.domain,
            "output_shapes": [list(s) if s is not None else None for s in self.output_shapes],
            "macs": self.macs, "flops": self.flops, "params": self.params, "counted": self.counted,
            "uncounted_reason": self.uncounted_reason,
        }


@dataclass(frozen=True)
class DtypeTotal:
    """Number of parameter elements of one data type and the bytes they take."""
    count: int
    bytes: int


@dataclass(frozen=True)
class GraphStats:
    """Whole-graph statistics for the bound shapes: per-node costs, op histogram, parameters, activations."""
    input_shapes: dict[str, list[int]]
    nodes: tuple[NodeStats, ...]
    op_histogram: dict[str, int]
    parameters: dict[str, DtypeTotal]
    #: Sum of every intermediate tensor: the memory needed if nothing were ever freed or reused.
    activation_total_bytes: int
    #: Most bytes alive at once when each tensor is freed after its last consumer, in graph order.
    activation_peak_bytes: int
    largest_activation: tuple[str, int] | None
    subgraph_nodes: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Why ONNX Runtime's symbolic shape inference did not run (a missing module), else None: ONNX's own
    #: inference then leaves shapes computed through Shape -> Gather -> Concat -> Reshape unknown.
    shape_inference_issue: str | None = None

    @property
    def coverage(self) -> FlopCoverage:
        """How much of the arithmetic the totals cover, and whether they are a figure worth showing."""
        return flop_coverage(self.nodes, shape_inference_issue=self.shape_inference_issue)

    @property
    def total_macs(self) -> int:
        """MACs of the counted nodes: a lower bound when :attr:`partial`."""
        return sum(n.macs for n in self.nodes)

    @property
    def total_flops(self) -> int:
        """FLOPs of the counted nodes: a lower bound when :attr:`partial`."""
        return sum(n.flops for n in self.nodes)

    @property
    def partial(self) -> bool:
        """True when some node does arithmetic that is not in the totals."""
        return any(not n.counted for n in self.nodes)

    @property
    def param_count(self) -> int:
        """Parameter elements over every data type."""
        return sum(t.count for t in self.parameters.values())

    @property
    def param_bytes(self) -> int:
        """Bytes of every parameter (initializer), all data types together."""
        return sum(t.bytes for t in self.parameters.values())

    @property
    def uncounted(self) -> tuple[NodeStats, ...]:
        """Nodes whose arithmetic could not be counted (the totals are lower bounds when any exist)."""
        return tuple(n for n in self.nodes if not n.counted)

    def uncounted_by_op(self) -> dict[str, int]:
        """Uncounted nodes per op type, most frequent first."""
        return dict(Counter(_op_key(n.domain, n.op_type) for n in self.uncounted).most_common())

    def flops_by_op(self) -> dict[str, int]:
        """FLOPs summed per op type (``domain.Op`` outside the default domain), largest first."""
        totals: Counter = Counter()
        for n in self.nodes:
            totals[_op_key(n.domain, n.op_type)] += n.flops
        return dict(totals.most_common())

    def top_nodes(self, k: int = 10) -> list[NodeStats]:
        """The ``k`` nodes with the most FLOPs, largest first."""
        return sorted(self.nodes, key=lambda n: n.flops, reverse=True)[:k]

    def to_dict(self, *, nodes: bool = True) -> dict:
        """JSON-ready statistics; ``nodes=False`` leaves out the per-node list to keep reports small."""
        out = {
            "input_shapes": self.input_shapes,
            "node_count": len(self.nodes),
            "subgraph_nodes": self.subgraph_nodes,
            "op_histogram": self.op_histogram,
            "total_macs": self.total_macs,
            "total_flops": self.total_flops,
            # True: total_macs/total_flops are lower bounds; uncounted_by_op names what is missing.
            "flops_partial": self.partial,
            "flops_by_op": self.flops_by_op(),
            # sufficient False: the totals cover too few of the MAC ops to be shown as a figure.
            "flops_coverage": self.coverage.to_dict(),
            "shape_inference_issue": self.shape_inference_issue,
            "parameters": {
                "count": self.param_count, "bytes": self.param_bytes,
                "by_dtype": {k: {"count": v.count, "bytes": v.bytes} for k, v in self.parameters.items()},
            },
            "activations": {
                "total_bytes": self.activation_total_bytes, "peak_bytes": self.activation_peak_bytes,
                "largest": {"name": self.largest_activation[0], "bytes": self.largest_activation[1]}
                if self.largest_activation else None,
            },
            "uncounted_nodes": [n.name for n in self.uncounted],
            "uncounted_by_op": self.uncounted_by_op(),
            "notes": list(self.notes),
        }
        if nodes:
            out["nodes"] = [n.to_dict() for n in self.nodes]
        return out


def graph_stats(model: Model) -> GraphStats:
    """Ops, parameters, FLOPs per node and activation memory for the model's bound shapes (bound with
    defaults if it is not bound yet)."""
    if not model.is_bound:
        model = model.bind()
    graph = model.proto.graph
    inferred, issue = _infer_shapes(model)
    shapes = _shapes_by_name(inferred.graph, graph)
    params, param_owner = _parameters(graph)
    nodes = []
    for index, node in enumerate(graph.node):
        ins = tuple(shapes.get(name, (None, None))[1] if name else None for name in node.input)
        outs = tuple(shapes.get(name, (None, None))[1] for name in node.output)
        cost = node_cost(NodeShapes(node, ins, outs))
        node_params = sum(param_owner.get(name, 0) for name in node.input)  # weights count for their readers
        nodes.append(NodeStats(
            index=index, name=node.name or f"{node.op_type}_{index}", op_type=node.op_type,
            domain=node.domain, output_shapes=outs, macs=cost.macs if cost else 0,
            flops=cost.flops if cost else 0, params=node_params, counted=cost is not None,
            uncounted_reason=None if cost is not None else uncounted_reason(node),
        ))
    total, peak, largest = _activation_memory(graph, shapes)
    notes = []
    missing = [n for n in nodes if not n.counted and n.op_type in MAC_OPS]
    if missing:
        notes.append(f"{len(missing)} MAC op(s) without inferred shapes are not counted: "
                     + ", ".join(n.name for n in missing[:5]) + (" ..." if len(missing) > 5 else ""))
    unknown = sorted({_op_key(n.domain, n.op_type) for n in nodes
                      if not n.counted and n.uncounted_reason == "no FLOP rule for this op"})
    if unknown:
        notes.append("no FLOP rule for " + ", ".join(unknown) + ": these nodes are not counted.")
    sub = sum(_subgraph_node_count(n) for n in graph.node)
    if sub:
        notes.append(f"{sub} node(s) inside If/Loop/Scan bodies are not counted (they run data-dependently).")
    return GraphStats(
        input_shapes={k: list(v) for k, v in model.input_shapes.items()},
        nodes=tuple(nodes),
        op_histogram=dict(Counter(_op_key(n.domain, n.op_type) for n in graph.node).most_common()),
        parameters=params,
        activation_total_bytes=total,
        activation_peak_bytes=peak,
        largest_activation=largest,
        subgraph_nodes=sub,
        notes=tuple(notes),
        shape_inference_issue=issue,
    )


def model_flops(model: Model) -> int:
    """Total FLOPs of one inference at the model's bound shapes (1 MAC = 2 FLOPs)."""
    return graph_stats(model).total_flops


def inferred_tensors(model: Model) -> dict[str, tuple[int, tuple[int, ...] | None]]:
    """name -> (ONNX element type, shape or None) of every tensor whose type shape inference knows."""
    if not model.is_bound:
        model = model.bind()
    return _shapes_by_name(_infer_shapes(model)[0].graph, model.proto.graph)


# -- shape inference -----------------------------------------------------------------------------------

def _infer_shapes(model: Model) -> tuple[onnx.ModelProto, str | None]:
    """The light copy with inferred shapes, and why symbolic shape inference was unavailable (else None)."""
    src = model.proto
    light = onnx.ModelProto()
    light.ir_version = src.ir_version
    light.opset_import.extend(src.opset_import)
    light.functions.extend(src.functions)
    graph = light.graph
    graph.name = src.graph.name
    graph.node.extend(src.graph.node)
    graph.output.extend(src.graph.output)
    initializer_names = {t.name for t in src.graph.initializer}
    for spec in src.graph.input:
        if spec.name in initializer_names:
            continue
        bound = model.input_shapes.get(spec.name)
        elem = spec.type.tensor_type.elem_type
        graph.input.append(helper.make_tensor_value_info(spec.name, elem, list(bound)) if bound and elem
                           else spec)
    for tensor in src.graph.initializer:
        external = onnx.external_data_helper.uses_external_data(tensor)
        if numel(tensor.dims) <= _KEEP_VALUES_UP_TO and not external:
            graph.initializer.append(tensor)
        else:
            graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    symbolic, issue = _symbolic_shape_inference(light)
    if symbolic is not None:
        return symbolic, None
    try:
        return onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False, data_prop=True), issue
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError):
        # Shape inference can fail on one exotic op; keep what the graph declares rather than nothing.
        return light, issue


def _symbolic_shape_inference(light: onnx.ModelProto) -> tuple[onnx.ModelProto | None, str | None]:
    """ONNX Runtime's symbolic shape inference, or None when it gives up, with why it could not run at all
    (its module or sympy, which it imports and which onnxruntime itself does not require, is missing).

    It folds shape arithmetic that ONNX's own data propagation leaves unknown (e.g. a Slice whose end comes
    from Shape -> Gather -> Unsqueeze, as in exported BERT embeddings) and knows the com.microsoft ops.
    """
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError as exc:
        return None, _unavailable(exc)
    opset = next((o.version for o in light.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 7:
        return None, None  # it supports opset 7 and above only
    # SymbolicShapeInference.infer_shapes saves "sym_shape_infer_temp.onnx" into the working directory when
    # inference is incomplete (microsoft/onnxruntime onnxruntime/python/tools/symbolic_shape_infer.py, 1.32):
    # take the same steps here, so that inspecting a model never writes a file beside the user's.
    try:
        inference = SymbolicShapeInference(2**31 - 1, True, False, 0)  # int_max, auto_merge, guess_output_rank
        inference._preprocess(light)
        complete = False
        while inference.run_:
            complete = inference._infer_impl()
        inference._update_output_from_vi()
    except Exception:  # noqa: BLE001 - it asserts on ops it does not know; fall back to onnx's inference
        return None, None
    return (inference.out_mp_ if complete else None), None


def _unavailable(exc: ImportError) -> str:
    """Why symbolic shape inference could not be imported, and the install that fixes it."""
    missing = exc.name or ("sympy" if "sympy" in str(exc) else "onnxruntime")
    if missing.split(".")[0] == "onnxruntime":
        return "ONNX Runtime's symbolic shape inference is unavailable: onnxruntime is not installed"
    core = " (a core dependency of onnxaccel)" if missing == "sympy" else ""
    return (f"ONNX Runtime's symbolic shape inference is unavailable: {missing} is not installed{core}: "
            f"pip install {missing}")


def _shapes_by_name(inferred: onnx.GraphProto, original: onnx.GraphProto) -> dict[str, tuple[int, tuple | None]]:
    """name -> (elem_type, shape or None) for every tensor whose type is known."""
    out: dict[str, tuple[int, tuple | None]] = {}
    for t in original.initializer:
        out[t.name] = (t.data_type, tuple(t.dims))
    for node in original.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    out[node.output[0]] = (a.t.data_type, tuple(a.t.dims))
    for vi in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        if vi.name in out or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        shape = None
        if tt.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim)
            shape = dims if all(d is not None for d in dims) else None
        out[vi.name] = (tt.elem_type, shape)
    return out


# -- parameters and memory -----------------------------------------------------------------------------

def _parameters(graph: onnx.GraphProto) -> tuple[dict[str, DtypeTotal], dict[str, int]]:
    """Totals per dtype, and element count per weight name (initializers and Constant node values)."""
    tensors: list[onnx.TensorProto] = list(graph.initializer)
    for node in graph.node:
        if node.op_type == "Constant":
            tensors.extend(a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR)
    totals: dict[str, list[int]] = {}
    for tensor in tensors:
        count = numel(tensor.dims)
        dtype = onnx.TensorProto.DataType.Name(tensor.data_type).lower()
        entry = totals.setdefault(dtype, [0, 0])
        entry[0] += count
        entry[1] += tensor_bytes(tensor.data_type, count)
    owner = {t.name: numel(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    owner[node.output[0]] = numel(a.t.dims)
    ordered = sorted(totals.items(), key=lambda kv: kv[1][1], reverse=True)
    return {k: DtypeTotal(v[0], v[1]) for k, v in ordered}, owner


def tensor_bytes(elem_type: int, count: int) -> int:
    """Bytes taken by ``count`` elements of ONNX type ``elem_type`` (sub-byte types packed, rounded up)."""
    name = onnx.TensorProto.DataType.Name(elem_type)
    if name in _SUB_BYTE_BITS:
        return (count * _SUB_BYTE_BITS[name] + 7) // 8
    try:
        return count * np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return count  # unknown element types: count one byte each rather than fail


def _activation_memory(graph: onnx.GraphProto, shapes: dict) -> tuple[int, int, tuple[str, int] | None]:
    weights = {t.name for t in graph.initializer}
    weights.update(n.output[0] for n in graph.node if n.op_type == "Constant" and n.output)
    size = {}
    for name, (elem, shape) in shapes.items():
        if name not in weights and shape is not None and elem:
            size[name] = tensor_bytes(elem, numel(shape))
    last_use: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in _node_reads(node):
            last_use[name] = i
    keep = {o.name for o in graph.output}
    live = {i.name for i in graph.input if i.name not in weights}
    current = sum(size.get(n, 0) for n in live)
    peak, total = current, 0
    for i, node in enumerate(graph.node):
        if node.op_type == "Constant":
            continue
        for name in node.output:
            if name and name not in live:
                live.add(name)
                current += size.get(name, 0)
                total += size.get(name, 0)
        peak = max(peak, current)
        for name in _node_reads(node):
            if last_use.get(name) == i and name in live and name not in keep:
                live.discard(name)
                current -= size.get(name, 0)
    produced = {o for n in graph.node if n.op_type != "Constant" for o in n.output if o in size}
    largest = max(((n, size[n]) for n in produced), key=lambda kv: kv[1], default=None)
    return total, peak, largest


def _node_reads(node: onnx.NodeProto) -> Iterable[str]:
    """Inputs of a node, including the outer-scope names its subgraphs read."""
    yield from (n for n in node.input if n)
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for inner in g.node:
                yield from _node_reads(inner)


def _subgraph_node_count(node: onnx.NodeProto) -> int:
    count = 0
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            count += len(g.node) + sum(_subgraph_node_count(n) for n in g.node)
    return count


def _op_key(domain: str, op_type: str) -> str:
    return op_type if domain in ("", "ai.onnx") else f"{domain}.{op_type}"
