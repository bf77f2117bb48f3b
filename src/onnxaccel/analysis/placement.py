"""Where a compiled model runs: nodes per provider, fallbacks, partitions (graph breaks), host-device copies,
and whether CUDA/HIP graph capture can work.

The node placement comes from the runner (ONNX Runtime's ``get_provider_graph_assignment_info``). Edges
between nodes come from the graph ONNX Runtime really runs, which it writes out when
``SessionOptions.optimized_model_filepath`` is set; that costs one more session, so it is built only when
more than one provider got nodes. Compiling providers (MIGraphX, TensorRT) cannot write it ("Unable to
serialize model as it contains compiled nodes", inference_session.cc); the original graph stands in then.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field

import onnx

from onnxaccel import providers
from onnxaccel.engines.base import CPU, PlacedNode, Placement, Runner
from onnxaccel.engines.ort import capture_native_stderr, import_ort
from onnxaccel.engines.ort_ep_options import ep_environment

MEMCPY_OPS = ("MemcpyFromHost", "MemcpyToHost")
CONTROL_FLOW_OPS = ("If", "Loop", "Scan")

# Graph capture, per requested provider: (feature, option that enables it, rule). Rules are those of
# onnxruntime/core/session/inference_session.cc (ORT 1.17-1.31, "This session cannot use the CUDA Graph
# feature as requested by the user ..."): no node may contain a subgraph (If/Loop/Scan); for the CUDA EP
# every node must be on CUDA or CPU and no MemcpyFromHost/MemcpyToHost may exist (CPU nodes are allowed
# only as copy-free shape computations); for the TensorRT EP every node must be on TensorRT.
# The ROCm EP's graph capture is assumed to follow the CUDA rule (not verified on ROCm hardware).
# Keyed by device word here; the ORT provider name and the option that enables capture come from the
# provider's spec (onnxaccel.providers).
_CAPTURE_RULES = {"cuda": ("CUDA graph", "cuda"), "rocm": ("HIP graph", "cuda"), "tensorrt": ("CUDA graph", "single-ep")}
_CAPTURE = {providers.get(device).provider: (feature, providers.get(device).graph_option, rule)
            for device, (feature, rule) in _CAPTURE_RULES.items()}

#: Provider options that switch graph capture on.
CAPTURE_OPTIONS = frozenset(option for _, option, _ in _CAPTURE.values())


@dataclass(frozen=True)
class Partition:
    """A connected run of nodes on one provider: data crossing its border is a graph break."""

    provider: str
    nodes: int
    first: str

    def to_dict(self) -> dict:
        """JSON-ready form of the partition."""
        return {"provider": self.provider, "nodes": self.nodes, "first_node": self.first}


@dataclass(frozen=True)
class Copy:
    """A Memcpy node ONNX Runtime inserted, and the nodes on either side of it."""

    name: str
    op_type: str
    tensor: str
    producer: str | None
    consumers: tuple[str, ...]

    def to_dict(self) -> dict:
        """JSON-ready form of the copy node."""
        return {"name": self.name, "op_type": self.op_type, "tensor": self.tensor, "producer": self.producer,
                "consumers": list(self.consumers)}


@dataclass(frozen=True)
class GraphCapture:
    """Can the session run as one captured CUDA/HIP graph? ``possible`` is None where it does not apply."""

    feature: str | None
    option: str | None
    possible: bool | None
    reason: str
    blocking: tuple[PlacedNode, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready verdict on graph capture, with the nodes that block it."""
        return {"feature": self.feature, "option": self.option, "possible": self.possible, "reason": self.reason,
                "blocking_nodes": [n.to_dict() for n in self.blocking]}


@dataclass(frozen=True)
class PlacementReport:
    """Where a session placed each node: providers, partitions (graph breaks), copies and graph-capture verdict."""
    placement: Placement
    partitions: tuple[Partition, ...]
    #: Where the edges came from: "single-provider", "optimized-graph" or "original-graph" (approximate).
    graph_source: str
    copies: tuple[Copy, ...]
    graph_capture: GraphCapture
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def requested(self) -> str:
        """The execution provider that was asked for."""
        return self.placement.requested

    @property
    def compute_nodes(self) -> int:
        """Nodes that compute (every placed node except Memcpy nodes)."""
        return self.placement.total - self.placement.memcpy_nodes

    @property
    def memcpy_nodes(self) -> int:
        """Host/device copy nodes, from the placement count or the graph, whichever saw more."""
        return max(self.placement.memcpy_nodes, len(self.copies))

    @property
    def graph_breaks(self) -> int:
        """Provider changes along the graph: partitions minus one."""
        return max(0, len(self.partitions) - 1)

    def per_provider(self) -> dict[str, int]:
        """Compute nodes per provider, most first (providers with none left out)."""
        counts = {ep: sum(1 for n in nodes if not n.op_type.startswith("Memcpy"))
                  for ep, nodes in self.placement.nodes.items()}
        return dict(sorted(((k, v) for k, v in counts.items() if v), key=lambda kv: -kv[1]))

    def to_dict(self) -> dict:
        """JSON-ready placement report (per-provider shares, fallback nodes, copies, partitions)."""
        total = self.compute_nodes or 1
        fallback = self.placement.fallback if self.requested != CPU else ()
        return {
            "requested": self.requested,
            "method": self.placement.method,
            "summary": self.placement.summary(),
            "compute_nodes": self.compute_nodes,
            "per_provider": {ep: {"nodes": n, "percent": round(100 * n / total, 2)}
                             for ep, n in self.per_provider().items()},
            "fallback": [n.to_dict() for n in fallback],
            "fallback_ops": dict(Counter(n.op_type for n in fallback).most_common()),
            "memcpy_nodes": self.memcpy_nodes,
            "copies": [c.to_dict() for c in self.copies],
            "partitions": [p.to_dict() for p in self.partitions],
            "graph_breaks": self.graph_breaks,
            "graph_source": self.graph_source,
            "graph_capture": self.graph_capture.to_dict(),
            "notes": list(self.notes),
        }


def analyze_placement(runner: Runner) -> PlacementReport:
    """Placement of a compiled runner, with partitions, copies and the graph-capture verdict."""
    placement = runner.placement
    original = runner.model.proto.graph
    notes: list[str] = []
    if not placement.known:
        notes.append("This ONNX Runtime cannot report node placement (needs onnxruntime >= 1.24).")
    providers_used = [ep for ep, nodes in placement.nodes.items() if nodes]
    graph, source = None, "single-provider"
    if len(providers_used) > 1:
        graph, problem = optimized_graph(runner)
        source = "optimized-graph" if graph is not None else "original-graph"
        if graph is None:
            graph = original
            notes.append(f"Partitions are estimated on the original graph ({problem}).")
    if graph is None:
        only = providers_used[0] if providers_used else placement.requested
        first = next((n.name for n in placement.nodes.get(only, ())), "")
        partitions = (Partition(only, placement.total, first),) if placement.total else ()
        copies: tuple[Copy, ...] = ()
        control_flow = _control_flow(original)
    else:
        partitions = find_partitions(graph, placement)
        copies = find_copies(graph)
        control_flow = _control_flow(graph)
    capture = graph_capture_verdict(placement, memcpy=max(placement.memcpy_nodes, len(copies)),
                                    control_flow=control_flow, copies=copies)
    return PlacementReport(placement, partitions, source, copies, capture, tuple(notes))


def optimized_graph(runner: Runner) -> tuple[onnx.GraphProto | None, str]:
    """The graph ONNX Runtime runs after its optimizations and partitioning, or None and why not."""
    session_options = getattr(runner, "_session_options", None)
    provider_list = getattr(runner, "_providers", None)
    if session_options is None or provider_list is None:
        return None, "the runner is not an ONNX Runtime session"

    ort = import_ort()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        so = session_options()
        so.optimized_model_filepath = path
        with capture_native_stderr():
            try:
                # The run's ORT_MIGRAPHX_* settings too (Microsoft 1.20-1.22.1 builds read FP16/INT8 only there).
                with ep_environment(getattr(runner, "provider_env", {})):
                    ort.InferenceSession(str(runner.model.path), so, providers=provider_list())
            except Exception as exc:  # noqa: BLE001 - e.g. compiled nodes cannot be serialized
                return None, str(exc).strip().splitlines()[0]
        return onnx.load(path, load_external_data=False).graph, ""


def find_partitions(graph: onnx.GraphProto, placement: Placement) -> tuple[Partition, ...]:
    """Connected components of same-provider nodes. Memcpy nodes belong to the device provider that runs
    them and are left out, so a CPU island between two device regions makes three partitions.

    Placement names the nodes as they were when ONNX Runtime partitioned the graph; the fusions that run
    afterwards (FusedMatMul, BiasGelu, ... on the provider that got the fused nodes) create nodes it does not
    name. Those take the provider of their neighbours.
    """
    provider_of = {n.name: ep for ep, nodes in placement.nodes.items() for n in nodes}
    names = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(graph.node)]
    kept = [i for i, n in enumerate(graph.node) if n.op_type not in MEMCPY_OPS]
    producer = {out: i for i in kept for out in graph.node[i].output if out}
    neighbours: dict[int, set[int]] = {i: set() for i in kept}
    for i in kept:
        for name in graph.node[i].input:
            j = producer.get(name)
            if j is not None:
                neighbours[i].add(j)
                neighbours[j].add(i)
    label = {i: provider_of.get(names[i]) for i in kept}
    changed = True
    while changed:
        changed = False
        for i in kept:
            if label[i] is None:
                seen = Counter(label[j] for j in neighbours[i] if label[j] is not None)
                if seen:
                    label[i] = seen.most_common(1)[0][0]
                    changed = True
    parent = {i: i for i in kept}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in kept:
        label[i] = label[i] or placement.requested
        for j in neighbours[i]:
            if label.get(j, placement.requested) == label[i] and j < i:
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in kept:
        groups.setdefault(find(i), []).append(i)
    parts = [Partition(label[m[0]], len(m), names[min(m)]) for m in groups.values()]
    return tuple(sorted(parts, key=lambda p: names.index(p.first)))


def find_copies(graph: onnx.GraphProto) -> tuple[Copy, ...]:
    """Every MemcpyToHost/MemcpyFromHost node of ``graph`` with the tensor it copies and its neighbours."""
    producer = {out: (n.name or n.op_type) for n in graph.node for out in n.output}
    consumers: dict[str, list[str]] = {}
    for n in graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n.name or n.op_type)
    copies = []
    for n in graph.node:
        if n.op_type in MEMCPY_OPS:
            src = n.input[0] if n.input else ""
            copies.append(Copy(n.name, n.op_type, src, producer.get(src),
                               tuple(consumers.get(n.output[0], ())) if n.output else ()))
    return tuple(copies)


def graph_capture_verdict(placement: Placement, *, memcpy: int, control_flow: tuple[PlacedNode, ...] = (),
                          copies: tuple[Copy, ...] = ()) -> GraphCapture:
    """Mirror ONNX Runtime's own checks (see ``_CAPTURE``) so the answer comes before a session refuses.

    ``copies`` (from the optimized graph) narrows the blame to the CPU nodes next to a Memcpy."""
    requested = placement.requested
    if requested not in _CAPTURE:
        if requested == CPU:
            why = "graph capture is a GPU feature"
        elif requested == providers.get("migraphx").provider:
            # Nor in microsoft/onnxruntime onnxruntime/core/providers/migraphx/migraphx_execution_provider_info.h
            # at 03c1250 (tests/engines/migraphx/upstream/ort_info_h_03c1250.txt).
            why = ("the MIGraphX EP has no graph-capture option (none in the option table of onnxruntime-migraphx "
                   "1.27.1); it compiles each partition into one MIGraphX program instead")
        else:
            why = f"ONNX Runtime offers graph capture only for CUDA, TensorRT and ROCm, not {requested}"
        return GraphCapture(None, None, None, why)
    feature, option, rule = _CAPTURE[requested]
    short = requested.replace("ExecutionProvider", "")
    if control_flow:
        return GraphCapture(feature, option, False,
                            f"the graph has control-flow nodes ({_names(control_flow)}); ONNX Runtime refuses "
                            f"{feature}s for them", control_flow)
    if not placement.known:
        return GraphCapture(feature, option, None, "placement unknown with this ONNX Runtime")
    on_target = placement.count(requested) - sum(1 for n in placement.nodes.get(requested, ())
                                                 if n.op_type.startswith("Memcpy"))
    if on_target == 0:
        return GraphCapture(feature, option, False, f"no node runs on {short}")
    if rule == "single-ep":
        others = placement.fallback
        if others:
            return GraphCapture(feature, option, False,
                                f"{len(others)} node(s) are not on {short}: {_names(others)}", others)
        return GraphCapture(feature, option, True, f"every node runs on {short}")
    foreign = tuple(n for ep, nodes in placement.nodes.items() if ep not in (requested, CPU) for n in nodes)
    if foreign:
        return GraphCapture(feature, option, False,
                            f"{len(foreign)} node(s) run on other providers: {_names(foreign)}", foreign)
    on_cpu = tuple(n for n in placement.nodes.get(CPU, ()) if not n.op_type.startswith("Memcpy"))
    if memcpy:
        beside = {c.producer for c in copies} | {name for c in copies for name in c.consumers}
        blamed = tuple(n for n in on_cpu if n.name in beside) or on_cpu
        return GraphCapture(feature, option, False,
                            f"{memcpy} Memcpy node(s) copy data between {short} and the CPU for "
                            f"{len(blamed)} node(s) on the CPU: {_names(blamed)}", blamed)
    if on_cpu:
        return GraphCapture(feature, option, True,
                            f"possible: {len(on_cpu)} shape node(s) on the CPU need no copy ({_names(on_cpu)}); "
                            "the captured graph is valid only for the shapes it was captured with")
    return GraphCapture(feature, option, True, f"every node runs on {short}, no host-device copies")


def _control_flow(graph: onnx.GraphProto) -> tuple[PlacedNode, ...]:
    return tuple(PlacedNode(n.op_type, n.name, n.domain) for n in graph.node
                 if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute))


def _names(nodes: tuple[PlacedNode, ...], limit: int = 5) -> str:
    shown = ", ".join(f"{n.name or '(unnamed)'} ({n.op_type})" for n in nodes[:limit])
    return shown + (f" and {len(nodes) - limit} more" if len(nodes) > limit else "")
