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


def read_pb(path: str | Path, type_proto: onnx.TypeProto | None = None) -> Any:
    """Read one ONNX value from a ``.pb`` file.

    Returns a numpy array (TensorProto), a list (SequenceProto), None or the contained value
    (OptionalProto), or a dict (MapProto). ``type_proto`` (the graph's type of the input or output the file
    belongs to) says which message to parse; without it a TensorProto is tried first.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"Cannot read {path}: {exc}", "Check the path of the .pb file.") from exc
    kind = value_kind(type_proto)
    order = [kind] if kind else ["tensor_type", "sequence_type", "optional_type", "map_type"]
    last: Exception | None = None
    for candidate in order:
        try:
            return _parse(data, candidate)
        except (DecodeError, ValueError, TypeError, KeyError, RuntimeError) as exc:
            last = exc
    raise InputError(
        f"{path} is not an ONNX {kind.replace('_type', '') or 'value'} protobuf ({last}).",
        "Write it with onnx.numpy_helper.from_array(...).SerializeToString() (or from_list/from_optional for "
        "sequences and optionals), as ONNX's backend test data is written.",
    )


def _parse(data: bytes, kind: str) -> Any:
    if kind == "tensor_type":
        proto = onnx.TensorProto()
        proto.ParseFromString(data)
        if not proto.dims and not _has_data(proto):
            raise ValueError("empty TensorProto")
        return numpy_helper.to_array(proto)
    if kind == "sequence_type":
        proto = onnx.SequenceProto()
        proto.ParseFromString(data)
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
        proto = onnx.MapProto()
        proto.ParseFromString(data)
        return numpy_helper.to_dict(proto)
    raise ValueError(f"cannot read a {kind or 'value'} of this kind from a .pb file")


def _has_data(proto: onnx.TensorProto) -> bool:
    return bool(proto.raw_data or proto.float_data or proto.int32_data or proto.int64_data or proto.double_data
                or proto.uint64_data or proto.string_data or proto.external_data or proto.data_type)


def write_pb(path: str | Path, value: Any, name: str = "") -> Path:
    """Write one value (array, list of arrays, None) as TensorProto / SequenceProto / OptionalProto."""
    path = Path(path)
    if isinstance(value, list):
        proto = numpy_helper.from_list(value, name)
    elif value is None:
        proto = onnx.OptionalProto(name=name, elem_type=onnx.OptionalProto.UNDEFINED)
    elif isinstance(value, dict):
        proto = numpy_helper.from_dict(value, name)
    else:
        proto = numpy_helper.from_array(np.asarray(value), name)
    path.write_bytes(proto.SerializeToString())
    return path
