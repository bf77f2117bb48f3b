"""The last steps every zoo builder shares: versions, metadata, and the checks a built model must pass."""

from __future__ import annotations

import hashlib
import json

import onnx

from onnxaccel.errors import ModelFormatError

#: Metadata keys other onnxaccel modules read from zoo models.
META_ZOO_NAME = "onnxaccel.zoo"
META_DIM_DEFAULTS = "onnxaccel.dim_defaults"
META_PREPROCESS = "onnxaccel.preprocess"

PRODUCER_NAME = "onnxaccel.zoo"


def seed_for(name: str) -> int:
    """A fixed 64-bit seed derived from the zoo name, so a rebuild draws identical weights."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def ir_version_for_opset(opset: int) -> int:
    """The lowest IR version that can carry ``opset`` of the default domain.

    ``onnx.helper.make_model`` stamps the newest IR the installed onnx knows (``onnx.IR_VERSION``), and a
    runtime released before that onnx refuses a file with a newer IR than it reads; the lowest IR that
    the opset needs loads in every runtime that knows the opset. Rows of ``onnx.helper.VERSION_TABLE`` are
    (onnx release, IR version, ai.onnx opset, ai.onnx.ml opset, ai.onnx.training opset).
    """
    candidates = [row[1] for row in onnx.helper.VERSION_TABLE if row[2] >= opset]
    if not candidates:
        raise ValueError(f"opset {opset} is newer than the installed onnx knows")
    return min(candidates)


def set_default_opset(model: onnx.ModelProto, opset: int) -> None:
    """Make ``opset`` the model's default-domain opset and its IR version the lowest one that allows it."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
            break
    else:
        model.opset_import.add(domain="", version=opset)
    model.ir_version = ir_version_for_opset(opset)


def stamp(
    model: onnx.ModelProto,
    *,
    name: str,
    doc: str,
    dim_defaults: dict[str, int],
    extra: dict[str, str] | None = None,
) -> None:
    """Write the producer, the doc string and the ``onnxaccel.*`` metadata into ``model``."""
    model.producer_name = PRODUCER_NAME
    model.producer_version = ""
    model.domain = ""
    model.model_version = 0
    model.doc_string = doc
    model.graph.doc_string = ""
    props = {
        META_ZOO_NAME: name,
        META_DIM_DEFAULTS: json.dumps(dim_defaults, sort_keys=True),
        **(extra or {}),
    }
    del model.metadata_props[:]
    for key in sorted(props):
        model.metadata_props.add(key=key, value=props[key])


def validate(model: onnx.ModelProto, name: str, *, serialized: bytes | None = None) -> None:
    """Run the ONNX checker and strict, type-checked shape inference; a failure here is a builder bug.

    Shape inference runs on a skeleton whose float initializers are declared as graph inputs of the same
    type and shape: inference reads only their types, and this spares serializing hundreds of MB twice.
    ``serialized``, when given, is ``model`` already serialized; the checker reads it instead.
    """
    try:
        onnx.checker.check_model(serialized if serialized is not None else model)
        onnx.checker.check_model(_skeleton(model), full_check=True)  # full_check = strict shape inference
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ModelFormatError(
            f"The zoo builder produced an invalid model for '{name}'.",
            "This is a bug in onnxaccel's zoo; please report it with the details below.",
            details=str(exc),
        ) from exc


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    graph = model.graph
    weights = [init for init in graph.initializer if init.data_type == onnx.TensorProto.FLOAT]
    constants = [init for init in graph.initializer if init.data_type != onnx.TensorProto.FLOAT]
    skeleton_graph = onnx.helper.make_graph(
        list(graph.node),
        graph.name,
        list(graph.input) + [onnx.helper.make_tensor_value_info(w.name, w.data_type, list(w.dims)) for w in weights],
        list(graph.output),
        initializer=constants,
    )
    skeleton = onnx.helper.make_model(skeleton_graph, opset_imports=list(model.opset_import))
    skeleton.ir_version = model.ir_version
    return skeleton
