"""ONNX values stored as protobuf files (``.pb``): tensors, sequences, optionals and maps.

This is the layout of ONNX's backend test data, of ONNX Runtime's ``onnx_test_runner`` and of the ONNX Model
Zoo (``test_data_set_N/input_K.pb``). Which message a file holds is told by the graph's type for that input
or output, as those runners do; without one, the file is tried as a TensorProto, then as the other messages.
Conversion goes through onnx's own ``numpy_helper`` (bfloat16, float8 and int4 come back as ml_dtypes
arrays), never through pickles.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from onnxaccel.errors import InputError

#: The value kinds an ONNX graph input or output can have (onnx.proto TypeProto's oneof "value").
KINDS = ("tensor_type", "sequence_type", "optional_type", "map_type", "sparse_tensor_type")


def value_kind(type_proto: onnx.TypeProto | None) -> str:
    """'tensor_type', 'sequence_type', 'optional_type', 'map_type' or 'sparse_tensor_type' ('' if unset)."""
    if type_proto is None:
        return ""
    return type_proto.WhichOneof("value") or ""


def read_pb(path: str | Path, type_proto: onnx.TypeProto | None = None, what: str = "") -> Any:
    """Read one ONNX value from a ``.pb`` file.

    Returns a numpy array (TensorProto), a list (SequenceProto), None or the contained value
    (OptionalProto), or a dict (MapProto). ``type_proto`` (the graph's type of the input or output the file
    belongs to) says which message to parse; without it a TensorProto is tried first. ``what`` names the
    value in errors, e.g. ``input 'x0' (seq(tensor(float)))``.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"Cannot read {path}: {exc}", "Check the path of the .pb file.") from exc
    kind = value_kind(type_proto)
    order = [kind] if kind else ["tensor_type", "sequence_type", "optional_type", "map_type"]
    if kind == "optional_type":
        # An optional that holds a value may also be stored as the bare value (a TensorProto/SequenceProto).
        order.append(value_kind(type_proto.optional_type.elem_type))
    last: Exception | None = None
    for candidate in order:
        try:
            return _parse(data, candidate)
        except (DecodeError, ValueError, TypeError, KeyError, RuntimeError) as exc:
            last = exc
    if kind in ("sequence_type", "map_type"):
        _refuse_tensor(data, path, kind, what)
    raise InputError(
        f"{path} is not an ONNX {kind.replace('_type', '') or 'value'} protobuf ({last}).",
        "Write it with onnx.numpy_helper.from_array(...).SerializeToString() (or from_list/from_optional for "
        "sequences and optionals), as ONNX's backend test data is written.",
    )


def _refuse_tensor(data: bytes, path: Path, kind: str, what: str) -> None:
    """An InputError when ``data`` is a TensorProto but a sequence or map was wanted: a tensor's bytes can also
    parse as an empty SequenceProto, which ran the model on an empty sequence before."""
    try:
        array = _parse(data, "tensor_type")
    except (DecodeError, ValueError, TypeError, KeyError, RuntimeError):
        return
    wanted = kind.replace("_type", "")
    message, writer = {"sequence": ("SequenceProto", "from_list([array, ...])"),
                       "map": ("MapProto", "from_dict({key: value, ...})")}[wanted]
    raise InputError(
        f"{path} holds a TensorProto (a tensor, {array.dtype} {list(array.shape)}), but {what or 'the value'} "
        f"is a {wanted}: it needs a {message}, and a tensor file cannot stand for one.",
        f"Give a {message} .pb, as ONNX's backend test data stores {wanted} inputs (e.g. "
        f"test_sequence_insert_at_back/test_data_set_0/input_0.pb); write one with "
        f"onnx.numpy_helper.{writer}.SerializeToString().",
    )


def _exact(proto, data: bytes, message: str):
    """``proto`` parsed from ``data``, or ValueError when ``data`` had fields the message does not have (another
    message's bytes, e.g. a TensorProto read as a SequenceProto, parse without error into an empty one)."""
    proto.ParseFromString(data)
    size = proto.ByteSize()
    proto.DiscardUnknownFields()
    if proto.ByteSize() != size:
        raise ValueError(f"not a {message}: it has fields a {message} does not have")
    return proto


def _parse(data: bytes, kind: str) -> Any:
    if kind == "tensor_type":
        proto = onnx.TensorProto()
        proto.ParseFromString(data)
        if not proto.dims and not _has_data(proto):
            raise ValueError("empty TensorProto")
        return numpy_helper.to_array(proto)
    if kind == "sequence_type":
        proto = _exact(onnx.SequenceProto(), data, "SequenceProto")
        if proto.elem_type == onnx.SequenceProto.UNDEFINED:
            raise ValueError("SequenceProto without elem_type")
        return numpy_helper.to_list(proto)
    if kind == "optional_type":
        proto = onnx.OptionalProto()
        proto.ParseFromString(data)
        if proto.elem_type == onnx.OptionalProto.UNDEFINED:
            return None
        return numpy_helper.to_optional(proto)
    if kind == "map_type":
        proto = _exact(onnx.MapProto(), data, "MapProto")
        return numpy_helper.to_dict(proto)
    raise ValueError(f"cannot read a {kind or 'value'} of this kind from a .pb file")


def _has_data(proto: onnx.TensorProto) -> bool:
    return bool(proto.raw_data or proto.float_data or proto.int32_data or proto.int64_data or proto.double_data
                or proto.uint64_data or proto.string_data or proto.external_data or proto.data_type)


def write_pb(path: str | Path, value: Any, name: str = "", type_proto: onnx.TypeProto | None = None) -> Path:
    """Write one value (array, list of arrays, dict, None) as TensorProto / SequenceProto / MapProto /
    OptionalProto. With ``type_proto`` (the graph's type) an optional is written as an OptionalProto holding
    the value, as ONNX's backend test data stores optional outputs; without it None is an empty optional."""
    path = Path(path)
    path.write_bytes(to_proto(value, name, type_proto).SerializeToString())
    return path


def to_proto(value: Any, name: str = "", type_proto: onnx.TypeProto | None = None):
    """The protobuf message for one value (see :func:`write_pb`)."""
    if isinstance(value, (onnx.TensorProto, onnx.SequenceProto, onnx.OptionalProto, onnx.MapProto)):
        proto = type(value)()
        proto.CopyFrom(value)
        if name:
            proto.name = name
        return proto
    kind = value_kind(type_proto)
    if kind == "optional_type":
        inner = value_kind(type_proto.optional_type.elem_type)
        elem = {"tensor_type": onnx.OptionalProto.TENSOR, "sequence_type": onnx.OptionalProto.SEQUENCE,
                "map_type": onnx.OptionalProto.MAP}.get(inner)
        if value is None:
            return onnx.OptionalProto(name=name, elem_type=elem or onnx.OptionalProto.UNDEFINED)
        return numpy_helper.from_optional(_plain(value), name, elem)
    if value is None:
        return onnx.OptionalProto(name=name, elem_type=onnx.OptionalProto.UNDEFINED)
    if isinstance(value, list):
        elem_type = None
        if kind == "sequence_type" and not value:
            elem_type = onnx.SequenceProto.TENSOR
        return numpy_helper.from_list([_plain(v) for v in value], name, elem_type)
    if isinstance(value, dict):
        return numpy_helper.from_dict(value, name)
    return numpy_helper.from_array(_plain(value), name)


def _plain(value: Any) -> Any:
    """numpy scalars (np.float32(1.0)) as 0-d arrays; lists and dicts element-wise."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return value
    return np.asarray(value)
