"""Checks of a model's tensor data before anything reads it (split from model.py): every external data file
lies in the model's folder, exists, and holds at least the bytes each tensor's dims declare.

Why before: shape inference with data propagation (onnx's checker, ``inspect``) materializes declared sizes, so a
tiny model declaring FLOAT[2**40] in a 16-byte external file makes a process allocate what the dims declare;
ONNX Runtime refuses such a model only when it loads the data.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from onnxaccel.errors import ModelFormatError


def check_tensor_data(proto: onnx.ModelProto, path: Path) -> None:
    """Every tensor's data must exist and hold at least the bytes its dims declare, checked before anything
    reads the data: shape inference with data propagation (onnx's checker, ``inspect``) materializes declared
    sizes, and a 1 KB model declaring an initializer FLOAT[2**40] in a 16-byte external file grew a process to
    24 GB before the kernel killed it. ONNX Runtime refuses such a model only when it loads the data."""
    for tensor in onnx.external_data_helper._get_all_tensors(proto):
        declared = _declared_bytes(tensor)
        if not onnx.external_data_helper.uses_external_data(tensor):
            held = _held_bytes(tensor)
            if declared is not None and held is not None and held < declared:
                raise _too_big(path, tensor, declared, held, "in the model file")
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location")
        if location and not _inside(path.parent, location):
            raise ModelFormatError(
                f"{path} points tensor '{tensor.name}' at the external data file '{location}', outside the model's "
                f"folder {path.parent}: refused (a model may read only files beside it, as onnx's checker and "
                "ONNX Runtime require).",
                "Save the model with its external data files in its own folder (onnx.save_model(..., "
                "save_as_external_data=True, location='NAME.data')).",
            )
        if location and not (path.parent / location).exists():
            raise ModelFormatError(
                f"{path} keeps tensor '{tensor.name}' in the external data file '{location}', which is "
                f"not in {path.parent}.",
                "Keep the external data file(s) beside the .onnx file, with the names they were saved under.",
            )
        if not location or declared is None:
            continue
        try:
            size = (path.parent / location).stat().st_size
            offset, length = int(info.get("offset", 0)), info.get("length")
        except (OSError, ValueError):
            continue  # the loaders' own checks (and their path traversal refusal) report these
        available = max(0, size - offset) if length is None else min(int(length), max(0, size - offset))
        if available < declared:
            raise _too_big(path, tensor, declared, available, f"in '{location}' (offset {offset})")


def _inside(folder: Path, location: str) -> bool:
    """Whether external data ``location`` names a file inside ``folder`` (after resolving .. and links)."""
    if Path(location).is_absolute():
        return False
    try:
        return (folder / location).resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):
        return False


def _declared_bytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes ``tensor``'s dims and element type need; None for strings and unknown types."""
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    try:
        bits = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize * 8
    except (KeyError, ValueError, TypeError):
        return None
    if tensor.data_type in _FOUR_BIT_TYPES:
        bits = 4
    count = 1
    for dim in tensor.dims:
        count *= max(int(dim), 0)
    return (count * bits + 7) // 8


#: Element types packed two to a byte (onnx TensorProto INT4/UINT4/FLOAT4E2M1, where this onnx has them).
_FOUR_BIT_TYPES = {getattr(onnx.TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(onnx.TensorProto, n)}


def _held_bytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes an embedded tensor holds: its raw_data, or, for types whose typed field holds one value per
    element, that many elements; None where the count cannot be told (strings, complex and packed types)."""
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    if tensor.data_type not in _ONE_PER_ELEMENT:
        return None
    count = 1
    for dim in tensor.dims:
        count *= max(int(dim), 0)
    declared = _declared_bytes(tensor) or 0
    values = len(getattr(tensor, onnx.helper.tensor_dtype_to_field(tensor.data_type)))
    return declared if values >= count else declared * values // max(count, 1)


#: Types whose typed field holds exactly one value per element.
_ONE_PER_ELEMENT = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
                    onnx.TensorProto.UINT64, onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16,
                    onnx.TensorProto.UINT16, onnx.TensorProto.BOOL, onnx.TensorProto.FLOAT16,
                    onnx.TensorProto.BFLOAT16, onnx.TensorProto.UINT32}


def _too_big(path: Path, tensor: onnx.TensorProto, declared: int, held: int, where: str) -> ModelFormatError:
    dims = "x".join(str(d) for d in tensor.dims) or "scalar"
    return ModelFormatError(
        f"{path}: tensor '{tensor.name}' declares {dims} {onnx.TensorProto.DataType.Name(tensor.data_type)} "
        f"= {declared:,} bytes, but {held:,} bytes back it {where}. Refused before reading it (a model that "
        "declares more than it holds would make shape inference allocate the declared size).",
        "The model file or its external data is truncated or crafted: export or download it again.",
    )
