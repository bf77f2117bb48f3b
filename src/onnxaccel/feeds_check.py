"""Checking feeds against a model's signature (split from inputs.py): names, kinds, ranks, fixed dims and dtypes,
with a cast only where it is lossless. Every mismatch is an InputError naming the input, what it expects and
what it got; used by inputs.prepare_feeds and by the engines' runners.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import onnx

from onnxaccel.errors import InputError
from onnxaccel.model import Model, TensorSpec


def validate_feeds(model: Model, feeds: Mapping[str, Any]) -> dict[str, Any]:
    """Check names, types and shapes against the signature; cast only when the cast is lossless.

    Tensors become C-contiguous numpy arrays of the input's dtype (0-d arrays stay 0-d; numpy unicode or
    bytes arrays become the object arrays of str ONNX Runtime takes for strings); sequences become lists of
    them, optionals None or their value.
    """
    names = {s.name for s in model.inputs}
    unknown = sorted(set(feeds) - names)
    if unknown:
        raise InputError(
            f"Unknown input name(s): {', '.join(unknown)}.",
            f"The model's inputs are: {', '.join(sorted(names))}.",
        )
    missing = sorted(names - set(feeds))
    if missing:
        raise InputError(f"No value for input(s): {', '.join(missing)}.", "Give them with --input NAME=FILE.")
    out = {}
    for spec in model.inputs:
        value = feeds[spec.name]
        if spec.is_tensor:
            out[spec.name] = check_tensor(model, spec, value)
        else:
            out[spec.name] = _check_value(spec, spec.type_proto, value, spec.name)
    return out


def _check_value(spec: TensorSpec, tp, value: Any, where: str) -> Any:
    """A sequence / optional / map value against its TypeProto; tensors inside are converted."""
    kind = tp.WhichOneof("value") if tp is not None else "tensor_type"
    if kind == "optional_type":
        return None if value is None else _check_value(spec, tp.optional_type.elem_type, value, where)
    if kind == "sequence_type":
        if not isinstance(value, (list, tuple)):
            raise InputError(
                f"Input '{where}' is a {spec.type_text}; the value given is a {type(value).__name__}, not a list.",
                f"Give it as an ONNX SequenceProto: --input {spec.name}=FILE.pb.",
            )
        return [_check_value(spec, tp.sequence_type.elem_type, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if kind == "map_type":
        if not isinstance(value, dict):
            raise InputError(f"Input '{where}' is a {spec.type_text}; the value given is not a map.",
                             f"Give it as an ONNX MapProto: --input {spec.name}=FILE.pb.")
        return value
    if value is None or isinstance(value, (list, dict)):
        raise InputError(f"Input '{where}' expects a tensor; the value given is {type(value).__name__}.",
                         "Check that the file belongs to this input.")
    elem = tp.tensor_type.elem_type if tp is not None else spec.elem_type
    return _convert_dtype(np.asarray(value), _np_dtype(elem, spec), where)


def _np_dtype(elem_type: int, spec: TensorSpec) -> np.dtype:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return spec.np_dtype


def check_tensor(model: Model, spec: TensorSpec, value: Any) -> np.ndarray:
    """``value`` as the array ``spec`` takes: rank, fixed dims and dtype checked (a lossless cast at most)."""
    if value is None or isinstance(value, (list, dict)):
        raise InputError(f"Input '{spec.name}' expects a tensor; the value given is {type(value).__name__}.",
                         "Check that the file belongs to this input.")
    arr = _convert_dtype(np.asarray(value), spec.np_dtype, spec.name)
    if spec.shape is not None:
        if arr.ndim != len(spec.shape):
            raise InputError(
                f"Input '{spec.name}' expects rank {len(spec.shape)} {spec.shape_text()}; the value given "
                f"has shape {list(arr.shape)}.",
                "Reshape the array, or check that it belongs to this input.",
            )
        for axis, (dim, got) in enumerate(zip(spec.shape, arr.shape)):
            if isinstance(dim, int) and dim > 0 and dim != got:
                raise InputError(
                    f"Input '{spec.name}' axis {axis} must be {dim} {spec.shape_text()}; the value given "
                    f"has shape {list(arr.shape)}.",
                    "Resize or reshape the data to the model's input shape.",
                )
    bound = model.input_shapes.get(spec.name)
    if bound is not None and tuple(arr.shape) != tuple(bound):
        raise InputError(
            f"Input '{spec.name}' is bound to shape {list(bound)} but the value given has shape "
            f"{list(arr.shape)}.",
            f"Bind it to the data: --shape {spec.name}={'x'.join(map(str, arr.shape))}.",
        )
    return arr


def _convert_dtype(arr: np.ndarray, want: np.dtype, where: str) -> np.ndarray:
    """Lossless conversion to ``want``; C-contiguous; 0-d stays 0-d (np.ascontiguousarray makes it 1-d)."""
    if arr.dtype != want:
        if want.kind == "O" and arr.dtype.kind in "US":
            # ONNX Runtime takes string tensors as object arrays of str (numpy unicode arrays are refused).
            arr = np.vectorize(_text, otypes=[object])(arr) if arr.size else arr.astype(object)
        elif want.kind == "O" and arr.dtype.kind == "O":
            pass
        elif arr.dtype.kind == "V" and not _is_ml(arr.dtype) and arr.dtype.itemsize == want.itemsize:
            arr = arr.view(want)  # an ml_dtypes array saved by np.save reads back as raw bytes ('|V2')
        elif want.kind == "b" and arr.dtype.kind == "O" and all(isinstance(v, (bool, np.bool_)) for v in arr.flat):
            arr = arr.astype(bool)
        elif _is_ml(want) and arr.dtype.kind in "iu" and _int_fits(arr, want):
            arr = arr.astype(want)  # int4/uint4 given as int8/uint8 values inside their range
        elif np.can_cast(arr.dtype, want, casting="safe"):
            arr = arr.astype(want)
        else:
            hint = f"Save it as {want.name}, e.g. np.save(path, array.astype(np.{want.name}))."
            if _is_ml(want):
                hint = (f"Save it as {want.name}: np.save(path, array.astype(ml_dtypes.{want.name})), or write a "
                        f".pb with onnx.numpy_helper.from_array(array.astype(ml_dtypes.{want.name})).")
            elif want.kind == "O":
                hint = "Save it as text: np.save(path, np.array(['...'])) (numpy unicode, no pickles)."
            raise InputError(f"Input '{where}' expects {dtype_text(want)}; the value given is "
                             f"{dtype_text(arr.dtype)}.", hint)
    if want.kind == "O" and arr.size and not all(isinstance(v, (str, bytes)) for v in arr.flat):
        raise InputError(f"Input '{where}' expects strings; the value given holds other objects.",
                         "Save it as text: np.save(path, np.array(['...'])).")
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _is_ml(dtype: np.dtype) -> bool:
    return dtype.kind == "V" and dtype.type.__module__.startswith("ml_dtypes")


def _int_fits(arr: np.ndarray, want: np.dtype) -> bool:
    try:
        info = ml_dtypes.iinfo(want)
    except (ValueError, TypeError):
        return False
    return not arr.size or (int(arr.min()) >= int(info.min) and int(arr.max()) <= int(info.max))


def dtype_text(dtype: np.dtype) -> str:
    """A dtype as people read it (``string`` for numpy's str/object kinds)."""
    return "string" if dtype.kind in "OUS" else dtype.name


def fits(spec: TensorSpec, value: np.ndarray) -> bool:
    """Whether ``value``'s rank and fixed dims agree with ``spec`` (so its shape may bind the symbolic ones)."""
    if spec.shape is None:
        return True
    return len(spec.shape) == value.ndim and all(
        not isinstance(d, int) or d == g for d, g in zip(spec.shape, value.shape))
