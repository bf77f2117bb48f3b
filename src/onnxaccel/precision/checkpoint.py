"""The checkpoint every model onnxaccel writes goes through: topological order, then the full ONNX checker.

Converters append what they insert at the end of the node list (onnxruntime.transformers.float16 adds its
Cast nodes with ``model.graph.node.extend``, onnxruntime/python/tools/transformers/float16.py, release 1.32.0),
and ONNX requires "nodes in a graph must be topologically sorted" (onnx/onnx docs/IR.md, Graphs): the checker
and ONNX Runtime refuse such graphs. So :func:`sort_graph` reorders nodes (stable: a node keeps its place
unless a producer comes later), including the bodies of If/Loop/Scan, and :func:`validate` runs
``onnx.checker.check_model(full_check=True)`` (structure plus strict shape inference). A failure names the
converter that produced the graph, so it is reported as our bug in that step, not as the user's model.
:func:`save_model` writes a checked model atomically (every converted model, the cached precision variants of
`run -p fp16/int8` and every file `optimize` writes). It lives with the precision conversion, below the pipeline,
because the pipeline's converted variants are written through it; ``transform`` uses it from here.

Protobuf cannot serialize a message over 2 GiB (onnx.checker / onnx.save raise "Message onnx.ModelProto
exceeds maximum protobuf size of 2GB"), so larger models keep their weights in one external data file
beside the .onnx (onnx.save_model(save_as_external_data=True)).
"""

from __future__ import annotations

import heapq
import os
import tempfile
from pathlib import Path

import onnx

from onnxaccel.errors import ModelError

#: Protobuf cannot serialize more than 2 GiB; larger models are checked from their file (external data).
IN_MEMORY_LIMIT = 1_800_000_000
#: Above this, weights go to an external data file (protobuf's hard limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def sort_graph(graph: onnx.GraphProto) -> None:
    """Reorder ``graph.node`` topologically in place (stable), and the bodies of its subgraphs.

    A node depends on its inputs and on the outer-scope names its subgraphs read. Names nobody in this graph
    produces (graph inputs, initializers, outer scope) are available from the start. A cycle, or an input
    nobody produces, leaves those nodes at the end in their order, for the checker to name.
    """
    nodes = list(graph.node)
    produced = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    needs: list[set[int]] = []
    for i, node in enumerate(nodes):
        names = set(node.input) | _free_names(node)
        needs.append({produced[name] for name in names if name in produced and produced[name] != i})
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                sort_graph(sub)
    users: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
    for i, deps in enumerate(needs):
        for dep in deps:
            users[dep].append(i)
    waiting = [len(deps) for deps in needs]
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for user in users[i]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    placed = set(order)
    order += [i for i in range(len(nodes)) if i not in placed]
    if order != list(range(len(nodes))):
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)


class CheckerError(ModelError):
    """A model fails onnx.checker's full check (:func:`validate`); not an I/O error, which stays a ModelError."""


def validate(proto: onnx.ModelProto, converter: str, *, path: Path | None = None,
             original: onnx.ModelProto | Path | None = None) -> onnx.ModelProto:
    """Sort ``proto`` (in place) and run the full checker; return it, or raise naming ``converter``.

    Models over the protobuf limit are checked from ``path`` (already written with external data). With
    ``original`` (the model before the conversion), a failure the original already has is reported as the
    input's, not as a bug of the conversion: ONNX's own test_mvn (opset 13, IR 7) fails the full check as
    shipped in the onnx wheel. Give the model the user gave (a proto, or its file, checked only on a failure),
    never an intermediate such as ONNX Runtime's optimized graph: that one failing is not the user's model
    failing.
    """
    sort_graph(proto.graph)
    try:
        if proto.ByteSize() <= IN_MEMORY_LIMIT:
            onnx.checker.check_model(proto, full_check=True)
        elif path is not None:
            onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:  # noqa: BLE001 - ValidationError, InferenceError, and protobuf errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        inherited = _original_failure(original)
        if inherited is not None:
            raise CheckerError(
                f"The model fails onnx.checker (full check) before any conversion, so {converter} cannot write a "
                f"valid one: {inherited}",
                f"Re-export the model with a current exporter, or check it with `python -c \"import onnx; "
                f"onnx.checker.check_model('MODEL', full_check=True)\"` (onnx {onnx.__version__}).",
                details=str(exc),
            ) from exc
        raise CheckerError(
            f"{converter} produced a model that fails onnx.checker (full check): {first}",
            "This is a bug in onnxaccel's conversion, not in your model; please report it with the model. "
            "Meanwhile keep the op it names out of the conversion (e.g. --fp16-block-op OP, --int8-exclude NODE).",
            details=str(exc),
        ) from exc
    return proto


def save_model(proto: onnx.ModelProto, path: Path, *, converter: str,
               original: onnx.ModelProto | Path | None = None) -> Path:
    """Write ``proto`` (weights loaded) to ``path`` atomically (temporary file + os.replace); external data
    when large.

    Every model goes through :func:`validate` first (topological order, full
    ONNX check); ``converter`` names the step that produced it in the error when it fails, and then nothing
    is written; ``original`` is the user's model, for :func:`validate`'s attribution. With external data, the
    weights file is named ``<file>.data`` beside the model; an older one of that name is replaced.
    """
    path = Path(path)
    if proto.ByteSize() <= IN_MEMORY_LIMIT:
        validate(proto, converter, original=original)
    else:
        sort_graph(proto.graph)  # checked below, from the file
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    large = proto.ByteSize() > EXTERNAL_DATA_THRESHOLD
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
        tmp_model = Path(tmp) / path.name
        try:
            if large:
                onnx.save_model(proto, str(tmp_model), save_as_external_data=True, all_tensors_to_one_file=True,
                                location=path.name + ".data", size_threshold=1024)
                validate(proto, converter, path=tmp_model, original=original)
                os.replace(Path(tmp) / (path.name + ".data"), path.parent / (path.name + ".data"))
            else:
                onnx.save_model(proto, str(tmp_model))
            os.replace(tmp_model, path)
        except OSError as exc:
            raise _unwritable(path, exc) from exc
    return path


def _original_failure(original: onnx.ModelProto | Path | None) -> str | None:
    """The first line of the full checker's complaint about ``original`` (a proto or a file), or None when it
    passes (or is absent)."""
    if original is None or (isinstance(original, onnx.ModelProto) and original.ByteSize() > IN_MEMORY_LIMIT):
        return None
    try:
        onnx.checker.check_model(original if isinstance(original, onnx.ModelProto) else str(original),
                                 full_check=True)
    except Exception as exc:  # noqa: BLE001 - as in validate
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


def _free_names(node: onnx.NodeProto) -> set[str]:
    """Names the node's subgraphs read from the enclosing scope."""
    names: set[str] = set()
    for attr in node.attribute:
        for sub in _subgraphs(attr):
            names |= _graph_free_names(sub)
    return names


def _graph_free_names(graph: onnx.GraphProto) -> set[str]:
    local = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    local |= {t.values.name for t in graph.sparse_initializer}
    local |= {out for n in graph.node for out in n.output}
    used = {name for n in graph.node for name in n.input if name} | {v.name for v in graph.output}
    for node in graph.node:
        used |= _free_names(node)
    return used - local


def _subgraphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def _unwritable(path: Path, exc: OSError) -> ModelError:
    """The error for a model file that cannot be written: where, and the system's reason."""
    return ModelError(f"Cannot write {path}: {exc.strerror or exc}.", "Choose a writable location for -o.",
                      details=str(exc))
