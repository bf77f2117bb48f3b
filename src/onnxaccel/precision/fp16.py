"""FP16 conversion with FP32 inputs/outputs, an op block list and a node block list.

The converter is ONNX Runtime's own ``onnxruntime.transformers.float16.convert_float_to_float16`` (shipped in
every onnxruntime wheel; microsoft/onnxruntime onnxruntime/python/tools/transformers/float16.py, release
1.32.0): it turns float tensors and initializers to float16, inserts Cast nodes around the ops and nodes it
must keep in float32, and with ``keep_io_types=True`` leaves the graph's inputs and outputs float32. Its
``DEFAULT_OP_BLOCK_LIST`` (ops without float16 kernels, e.g. TopK, Range, NonMaxSuppression, Resize's old form
Upsample) is always applied.

Three more kinds of node stay FP32 automatically, and the result lists each with its reason:

* the ONNX schema gives one of the node's float inputs or outputs no float16 type: TfIdfVectorizer's output
  (T1 = float), LayerNormalization's Mean/InvStdDev outputs (U = float or bfloat16) when the node declares
  them, ai.onnx.ml ops (``onnx.defs.get_schema(op, opset).type_constraints``);
* the execution provider it will run on has no float16 kernel for the op: a session is built and every
  "Could not find an implementation for OP(version)" (ONNX Runtime's NOT_IMPLEMENTED message,
  onnxruntime/core/framework/session_state.cc, release 1.32.0) blocks that op type, and the model is
  converted again;
* the user's or the model's own list (``--fp16-block-op``, ``--keep-fp32``, :data:`KEEP_FP32_KEY`).

A model can carry the nodes it wants kept in FP32 in its metadata (:data:`KEEP_FP32_KEY`), so every path that
converts it to FP16 (``optimize --fp16``, ``run --precision fp16``, the AMP search) honours the same list.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import onnx

from onnxaccel.errors import MissingDependencyError, ModelError
from onnxaccel.precision.checkpoint import validate
from onnxaccel.precision.fp16_rules import missing_kernel, runtime_limit_blocks, schema_blocks, session_refusal
from onnxaccel.precision.fp16_sequences import cast_sequence_io

#: Model metadata key: JSON list of node names that FP16 conversion must keep in FP32.
KEEP_FP32_KEY = "onnxaccel.fp16.keep_fp32_nodes"
#: Model metadata key: the precision a transformed model was converted to (fp16, mixed, int8-qdq, ...).
PRECISION_KEY = "onnxaccel.precision"
#: Model metadata key: JSON list of {node, op, reason} the FP16 conversion kept in FP32 (all reasons).
KEPT_KEY = "onnxaccel.fp16.kept"


def name_unnamed_nodes(proto: onnx.ModelProto) -> int:
    """Give every unnamed node of the main graph a unique name (``<op>_<index>``); return how many.

    Block lists, divergence reports and the optimize report refer to nodes by name, and exporters (Paddle,
    older tf2onnx) leave some unnamed.
    """
    taken = {n.name for n in proto.graph.node if n.name}
    count = 0
    for index, node in enumerate(proto.graph.node):
        if node.name:
            continue
        name = f"{node.op_type}_{index}"
        while name in taken:
            name += "_"
        node.name = name
        taken.add(name)
        count += 1
    return count


def _metadata_list(proto: onnx.ModelProto, key: str) -> list:
    """The JSON list stored under ``key`` in the model's metadata ([] when absent or not a list)."""
    for prop in proto.metadata_props:
        if prop.key == key:
            try:
                value = json.loads(prop.value)
            except ValueError:
                return []
            return value if isinstance(value, list) else []
    return []


def keep_fp32_nodes(proto: onnx.ModelProto) -> list[str]:
    """The node names the model's metadata asks FP16 conversion to keep in FP32."""
    return [str(n) for n in _metadata_list(proto, KEEP_FP32_KEY)]


def set_metadata(proto: onnx.ModelProto, key: str, value: str) -> None:
    """Set the model metadata entry ``key`` to ``value`` (replacing it, never adding a second one)."""
    for prop in proto.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    proto.metadata_props.add(key=key, value=value)


def set_keep_fp32_nodes(proto: onnx.ModelProto, names: Iterable[str]) -> None:
    """Record in the model's metadata the nodes every later FP16 conversion must keep in FP32 (AMP's result)."""
    set_metadata(proto, KEEP_FP32_KEY, json.dumps(sorted(set(names))))


@dataclass
class KeptNode:
    """A node FP16 conversion left in FP32, and why."""

    node: str
    op: str
    reason: str

    def to_dict(self) -> dict:
        """The node, its op type and the reason, as the report and the model's metadata store them."""
        return {"node": self.node, "op": self.op, "reason": self.reason}


@dataclass
class Fp16Conversion:
    """The converted model, the nodes now computing in FP16 per op type, and the nodes kept in FP32."""

    proto: onnx.ModelProto = field(repr=False)
    converted: dict[str, int]
    kept: list[KeptNode]
    provider: str | None = None

    @property
    def converted_nodes(self) -> int:
        """How many nodes compute in FP16 after the conversion."""
        return sum(self.converted.values())

    def kept_by_op(self) -> dict[str, dict]:
        """{op: {"nodes": count, "reason": first reason}} for the report."""
        out: dict[str, dict] = {}
        for kept in self.kept:
            entry = out.setdefault(kept.op, {"nodes": 0, "reason": kept.reason})
            entry["nodes"] += 1
        return out

    def to_dict(self) -> dict:
        """What was converted (per op) and what was kept in FP32 with why, for the optimize report."""
        return {"converted_nodes": self.converted_nodes, "converted_by_op": dict(sorted(self.converted.items())),
                "kept_fp32": [k.to_dict() for k in self.kept], "kept_fp32_by_op": self.kept_by_op(),
                "provider_probed": self.provider}


def convert_fp16(
    proto: onnx.ModelProto,
    *,
    keep_io_types: bool = True,
    op_block_list: Iterable[str] = (),
    node_block_list: Iterable[str] = (),
    provider: str | None = None,
) -> onnx.ModelProto:
    """Return an FP16 copy of ``proto`` (weights loaded); blocked ops and nodes stay FP32.

    See :func:`convert_fp16_detailed` for what is kept and why; this returns only the model.
    """
    return convert_fp16_detailed(proto, keep_io_types=keep_io_types, op_block_list=op_block_list,
                                 node_block_list=node_block_list, provider=provider).proto


def convert_fp16_detailed(
    proto: onnx.ModelProto,
    *,
    keep_io_types: bool = True,
    op_block_list: Iterable[str] = (),
    node_block_list: Iterable[str] = (),
    provider: str | None = None,
) -> Fp16Conversion:
    """Convert ``proto`` (weights loaded) to FP16 and say what was converted and what stayed FP32.

    ``node_block_list`` adds to the nodes named in the model's :data:`KEEP_FP32_KEY` metadata; the copy
    records that list there, and ``onnxaccel.precision`` = ``fp16`` or ``mixed``. Nodes whose schema has no
    float16 type are kept too (see the module docstring); with ``provider`` (e.g. ``CPUExecutionProvider``,
    when it is available here) ops without a float16 kernel in that provider are kept as well. The result is
    topologically sorted and passes the full ONNX check; a conversion that leaves no node in FP16 raises.
    """
    try:
        from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "cpu", "FP16 conversion") from exc

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    name_unnamed_nodes(model)
    drop_initializer_value_info(model)
    known = {n.name for n in model.graph.node}
    nodes = sorted(set(keep_fp32_nodes(model)) | set(node_block_list))
    missing = [n for n in nodes if n not in known]
    if missing:
        raise ModelError(
            f"FP16 block list names node(s) the model does not have: {', '.join(missing[:5])}.",
            "Node names are listed by `onnxaccel inspect --nodes`; unnamed nodes are named <OpType>_<index>.",
        )
    requested_ops = set(op_block_list)
    schema = schema_blocks(model) | runtime_limit_blocks(model, provider)  # node name -> reason
    provider_ops: dict[str, str] = {}  # op type -> reason
    refusal = None  # ONNX Runtime's message when the provider refuses the last conversion
    for _ in range(16):  # each round blocks at least one more op type, or stops
        ops = sorted(set(DEFAULT_OP_BLOCK_LIST) | requested_ops | set(provider_ops))
        converted = _convert(model, keep_io_types, ops, sorted(set(nodes) | set(schema)))
        if provider is None:
            break
        refusal = session_refusal(converted, provider)
        found = missing_kernel(refusal)
        if found is not None and found[0] in provider_ops:
            # Blocking it did not help: the op has no kernel at all (an old opset), not an FP16 matter.
            del provider_ops[found[0]]
            converted = _convert(model, keep_io_types, sorted(set(ops) - {found[0]}), sorted(set(nodes) | set(schema)))
            refusal = None  # the op fails in FP32 as well: the input's own matter, reported where it runs
            break
        if found is None or found[0] in ops:
            break
        provider_ops[found[0]] = (f"{provider} has no float16 kernel for {found[0]}({found[1]}) (\"Could not find "
                                  "an implementation\" when the FP16 model was loaded)")
    checked = _repair(model, converted, keep_io_types, ops, nodes, schema)
    if provider is not None and (refusal is not None or checked is not converted):
        refusal = session_refusal(checked, provider)
        if refusal is not None and missing_kernel(refusal) is None:
            raise _refused(refusal, provider)
    converted = checked
    kept = _kept(model, nodes, schema, requested_ops, provider_ops, set(DEFAULT_OP_BLOCK_LIST))
    result = Fp16Conversion(converted, _converted_by_op(model, converted), kept, provider)
    if not result.converted_nodes:
        reasons = "; ".join(f"{op} x{v['nodes']}: {v['reason']}" for op, v in result.kept_by_op().items())
        raise ModelError(
            "FP16 conversion changed no node of the model: no node computes in FP16 afterwards"
            + (f" (kept in FP32: {reasons})" if reasons else " (its float tensors are FP16 already)"
               if onnx.TensorProto.FLOAT16 in _elem_types(model).values() else " (it has no float computation)")
            + ".",
            "Run the model in FP32; FP16 would only add casts. If ops were kept by your --fp16-block-op or "
            "--keep-fp32, give fewer.",
        )
    set_keep_fp32_nodes(converted, nodes)
    set_metadata(converted, PRECISION_KEY, "mixed" if nodes else "fp16")
    set_metadata(converted, KEPT_KEY, json.dumps([k.to_dict() for k in kept]))
    return result


def _refused(message: str, provider: str) -> ModelError:
    """The error for an FP16 model ONNX Runtime would not load: nothing is written or cached."""
    first = message.splitlines()[0]
    return ModelError(
        f"The FP16 model would not load in ONNX Runtime ({provider}), so it was not written: {first}",
        "Keep the node it names in FP32 (--keep-fp32 NODE, or its op with --fp16-block-op OP), or run the model "
        "in the precision it has.", details=message)


def drop_initializer_value_info(proto: onnx.ModelProto) -> int:
    """Remove value_info entries of the main graph that name an initializer; return how many.

    An initializer carries its own type, so such an entry says nothing new, but the converter retypes value_info
    by name: it turns the entry to float16 while the initializer itself stays float32 when only kept nodes (a
    Cast kept in FP32) read it, and the full checker then fails with "Inferred elem type differs from existing
    elem type: (1) vs (10)". ONNX Runtime's saved graph has such entries after shape inference stamped every
    tensor (``--fix-shape``) and constant folding turned some of them into initializers.
    """
    initializers = {t.name for t in proto.graph.initializer}
    kept = [v for v in proto.graph.value_info if v.name not in initializers]
    dropped = len(proto.graph.value_info) - len(kept)
    if dropped:
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(kept)
    return dropped


def _convert(model: onnx.ModelProto, keep_io_types: bool, ops: list[str], nodes: list[str]) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    # The converter logs a warning per clamped initializer through the root logger; keep it quiet.
    logger = logging.getLogger("onnxruntime.transformers.float16")
    level = logger.level
    logger.setLevel(logging.ERROR)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    try:
        converted = convert_float_to_float16(
            copy, keep_io_types=keep_io_types, op_block_list=ops, node_block_list=nodes or None,
            disable_shape_infer=copy.ByteSize() > 1_800_000_000,
        )
        if keep_io_types:
            cast_sequence_io(model, converted)
        return converted
    except Exception as exc:  # noqa: BLE001 - the converter raises plain exceptions on odd graphs
        raise ModelError(
            f"FP16 conversion failed: {type(exc).__name__}: {exc}",
            "Block the op that fails with --fp16-block-op OP, or run `onnxaccel optimize --simplify` first.",
            details=repr(exc),
        ) from exc
    finally:
        logger.setLevel(level)


#: The checker's error names the node it failed on: "(op_type:X, node name: NAME): ...".
_FAILED_NODE = re.compile(r"node name: ([^)]+)\)")


def _repair(model, converted, keep_io_types, ops, nodes, schema) -> onnx.ModelProto:
    """Check the converted model; keep each node the checker names in FP32 and convert again.

    The converter types tensors by name and misses what an op's attributes decide (Constant's value_float,
    BitCast's and the window ops' output type, function bodies with float constants, If/Loop bodies of
    optionals): the full checker names such a node, which then stays FP32 with the checker's message as the
    reason. Sorting is part of the check (see :mod:`onnxaccel.precision.checkpoint`).
    """
    names = {n.name for n in model.graph.node}
    for _ in range(32):
        _ensure_default_opset(converted)
        try:
            return validate(converted, "FP16 conversion (onnxruntime.transformers.float16)")
        except ModelError as exc:
            found = _FAILED_NODE.search(exc.details or "")
            node = found.group(1).strip() if found else None
            if node not in names or node in schema or node in nodes:
                validate(converted, "FP16 conversion (onnxruntime.transformers.float16)", original=model)
                raise
            detail = (exc.details or "").strip().splitlines()[0].split("): ")[-1]
            schema[node] = f"FP16 would make the graph invalid (onnx.checker: {detail[:160]})"
            converted = _convert(model, keep_io_types, ops, sorted(set(nodes) | set(schema)))
    return validate(converted, "FP16 conversion (onnxruntime.transformers.float16)", original=model)


def _ensure_default_opset(proto: onnx.ModelProto) -> None:
    """The converter inserts ai.onnx Cast nodes; a model that imported only other domains (ai.onnx.ml) needs
    the default domain too, at the newest opset its IR version allows (onnx.helper.VERSION_TABLE)."""
    domains = {o.domain for o in proto.opset_import}
    if "" in domains or "ai.onnx" in domains:
        return
    if not any(n.domain in ("", "ai.onnx") for n in proto.graph.node):
        return
    rows = [row[2] for row in onnx.helper.VERSION_TABLE if row[1] <= proto.ir_version]
    proto.opset_import.add(domain="", version=max(rows) if rows else onnx.defs.onnx_opset_version())


def _kept(model, nodes, schema, requested_ops, provider_ops, default_ops) -> list[KeptNode]:
    """Every main-graph node left in FP32, with the first reason that applies to it."""
    chosen = set(nodes)
    kept = []
    for node in model.graph.node:
        if node.name in chosen:
            reason = "kept in FP32 as asked (--keep-fp32, AMP, or the model's metadata)"
        elif node.op_type in requested_ops:
            reason = "kept in FP32 as asked (--fp16-block-op)"
        elif node.name in schema:
            reason = schema[node.name]
        elif node.op_type in provider_ops:
            reason = provider_ops[node.op_type]
        elif node.op_type in default_ops:
            reason = "no float16 kernel in ONNX Runtime (onnxruntime.transformers.float16.DEFAULT_OP_BLOCK_LIST)"
        else:
            continue
        kept.append(KeptNode(node.name, node.op_type, reason))
    return kept


def _converted_by_op(original: onnx.ModelProto, converted: onnx.ModelProto) -> dict[str, int]:
    """Nodes of the original main graph that read or write a float16 tensor in the converted model that was not
    float16 in the original: a node already in FP16 before (ONNX's test_qlinearmatmul_3D_int8_float16 has FP16
    scales) is not converted by the conversion, so a model with nothing else is refused as a no-op."""
    ours = {n.name for n in original.graph.node}
    fp16 = onnx.TensorProto.FLOAT16
    before, types = _elem_types(original), _elem_types(converted)
    out: Counter = Counter()
    for node in converted.graph.node:
        if node.name in ours and any(types.get(name) == fp16 and before.get(name) != fp16
                                     for name in list(node.input) + list(node.output) if name):
            out[node.op_type] += 1
    return dict(out)


def _elem_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element types of the main graph's tensors (sequences by their element) after shape inference."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto) if proto.ByteSize() < 1_800_000_000 else proto
    except Exception:  # noqa: BLE001 - inference is best effort; the converter's value_info is kept
        inferred = proto
    graph = inferred.graph
    types = {t.name: t.data_type for t in graph.initializer}
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type.elem_type
        elif value.type.HasField("sequence_type") and value.type.sequence_type.elem_type.HasField("tensor_type"):
            types[value.name] = value.type.sequence_type.elem_type.tensor_type.elem_type  # seq(float16) counts
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
    return types


def fp16_kept(proto: onnx.ModelProto) -> list[dict]:
    """The kept-in-FP32 list a converted model records in its metadata (:data:`KEPT_KEY`)."""
    return _metadata_list(proto, KEPT_KEY)


def weight_bytes_by_type(proto: onnx.ModelProto) -> dict[str, int]:
    """Bytes of initializers (and Constant node values) per element type, e.g. {'float16': 1234}."""
    out: Counter = Counter()
    tensors = list(proto.graph.initializer)
    tensors += [a.t for n in proto.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    for tensor in tensors:
        name = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).name if tensor.data_type else "undefined"
        count = 1
        for dim in tensor.dims:
            count *= dim
        out[name] += count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return dict(out)
