"""FP16 conversion with FP32 inputs/outputs, an op block list and a node block list.

The converter is ONNX Runtime's own ``onnxruntime.transformers.float16.convert_float_to_float16`` (shipped in
every onnxruntime wheel; rocm_facts.md §3.2): it turns float tensors and initializers to float16, inserts Cast
nodes around the ops and nodes it must keep in float32, and with ``keep_io_types=True`` leaves the graph's
inputs and outputs float32. Its ``DEFAULT_OP_BLOCK_LIST`` (ops without float16 kernels, e.g. TopK, Range,
NonMaxSuppression, Resize's old form Upsample) is always applied.

A model can carry the nodes it wants kept in FP32 in its metadata (:data:`KEEP_FP32_KEY`), so every path that
converts it to FP16 (``optimize --fp16``, ``run --precision fp16``, the AMP search) honours the same list.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable

import onnx

from onnxaccel.errors import MissingDependencyError, ModelError

#: Model metadata key: JSON list of node names that FP16 conversion must keep in FP32.
KEEP_FP32_KEY = "onnxaccel.fp16.keep_fp32_nodes"
#: Model metadata key: the precision a transformed model was converted to (fp16, mixed, int8-qdq, ...).
PRECISION_KEY = "onnxaccel.precision"


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


def keep_fp32_nodes(proto: onnx.ModelProto) -> list[str]:
    """The node names the model's metadata asks FP16 conversion to keep in FP32."""
    for prop in proto.metadata_props:
        if prop.key == KEEP_FP32_KEY:
            try:
                names = json.loads(prop.value)
            except ValueError:
                return []
            return [str(n) for n in names] if isinstance(names, list) else []
    return []


def set_metadata(proto: onnx.ModelProto, key: str, value: str) -> None:
    for prop in proto.metadata_props:
        if prop.key == key:
            prop.value = value
            return
    proto.metadata_props.add(key=key, value=value)


def set_keep_fp32_nodes(proto: onnx.ModelProto, names: Iterable[str]) -> None:
    set_metadata(proto, KEEP_FP32_KEY, json.dumps(sorted(set(names))))


def convert_fp16(
    proto: onnx.ModelProto,
    *,
    keep_io_types: bool = True,
    op_block_list: Iterable[str] = (),
    node_block_list: Iterable[str] = (),
) -> onnx.ModelProto:
    """Return an FP16 copy of ``proto`` (weights loaded); blocked ops and nodes stay FP32.

    ``node_block_list`` adds to the nodes named in the model's :data:`KEEP_FP32_KEY` metadata. The copy
    records the final list there, and ``onnxaccel.precision`` = ``fp16`` or ``mixed``.
    """
    try:
        from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "cpu", "FP16 conversion") from exc
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    name_unnamed_nodes(model)
    known = {n.name for n in model.graph.node}
    nodes = sorted(set(keep_fp32_nodes(model)) | set(node_block_list))
    missing = [n for n in nodes if n not in known]
    if missing:
        raise ModelError(
            f"FP16 block list names node(s) the model does not have: {', '.join(missing[:5])}.",
            "Node names are listed by `onnxaccel inspect --nodes`; unnamed nodes are named <OpType>_<index>.",
        )
    ops = sorted(set(DEFAULT_OP_BLOCK_LIST) | set(op_block_list))
    # The converter logs a warning per clamped initializer through the root logger; keep it quiet.
    logger = logging.getLogger("onnxruntime.transformers.float16")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        converted = convert_float_to_float16(
            model, keep_io_types=keep_io_types, op_block_list=ops, node_block_list=nodes or None,
            disable_shape_infer=model.ByteSize() > 1_800_000_000,
        )
    except Exception as exc:  # noqa: BLE001 - the converter raises plain exceptions on odd graphs
        raise ModelError(
            f"FP16 conversion failed: {type(exc).__name__}: {exc}",
            "Block the op that fails with --fp16-block-op OP, or run `onnxaccel optimize --simplify` first.",
            details=repr(exc),
        ) from exc
    finally:
        logger.setLevel(level)
    set_keep_fp32_nodes(converted, nodes)
    set_metadata(converted, PRECISION_KEY, "mixed" if nodes else "fp16")
    return converted


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
