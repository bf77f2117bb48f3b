"""Feeds: load them from .npy/.npz/.pb files, images and literal values; synthesize the ones not given.

Every feed is checked against the model's signature: a wrong name, rank, size or dtype is an InputError
that says which input, what it expects and what it got. Values are numpy arrays for tensors (ml_dtypes
arrays for bfloat16/float8/int4, object arrays of str for strings), lists for sequences, None or the value
for optionals, dicts for maps. docs/INPUTS.md describes every form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx

from onnxaccel.errors import InputError
# The file readers live in inputs_files; IMAGE_SUFFIXES, IMAGENET_*, ImagePreprocess and load_image are
# re-exported because calibration, the CLI, pipeline, scale and transform import them from here.
from onnxaccel.inputs_files import (  # noqa: F401
    IMAGE_SUFFIXES, IMAGENET_MEAN, IMAGENET_STD, ImagePreprocess, load_image, read_npy, read_npz,
)
from onnxaccel.model import Model, TensorSpec
from onnxaccel.protobuf_values import read_pb
from onnxaccel.synthesis import synthesize, synthesize_described

__all__ = ["FeedOrigin", "FeedSet", "ImagePreprocess", "load_feeds", "load_image", "parse_value_ranges",
           "prepare_feeds", "synthesize", "validate_feeds"]


@dataclass(frozen=True)
class FeedOrigin:
    """Where one input's value came from: ``file`` (the path), ``literal`` (the text), ``image`` (the path) or
    ``synthesized`` (how it was drawn), with the shape and type fed."""

    name: str
    source: str
    detail: str
    shape: tuple[int, ...] | None
    type: str

    @property
    def synthesized(self) -> bool:
        """True when the feed was generated rather than given."""
        return self.source == "synthesized"

    def describe(self) -> str:
        """One line saying where the feed came from and its type and shape."""
        shape = "x".join(map(str, self.shape)) if self.shape else ("scalar" if self.shape == () else "")
        what = f"{self.type} {shape}".strip()
        return f"{self.name}: {what}, {self.source} ({self.detail})"

    def to_dict(self) -> dict:
        """JSON-ready form of the origin."""
        return {"name": self.name, "source": self.source, "detail": self.detail,
                "shape": list(self.shape) if self.shape is not None else None, "type": self.type}


@dataclass
class FeedSet:
    """The bound model, its validated feeds and where each came from."""

    model: Model
    feeds: dict[str, Any]
    origins: list[FeedOrigin] = field(default_factory=list)

    @property
    def synthesized(self) -> list[FeedOrigin]:
        """Origins of the feeds that were generated, for the synthetic-input warning."""
        return [o for o in self.origins if o.synthesized]


def parse_value_ranges(items: Sequence[str] | None) -> dict[str, tuple[float, float]]:
    """Parse ``--value-range`` items: ``NAME=LOW,HIGH`` for one input, ``LOW,HIGH`` for every input."""
    out: dict[str, tuple[float, float]] = {}
    for item in items or ():
        name, sep, text = item.rpartition("=")
        parts = text.split(",")
        try:
            low, high = (float(v) for v in parts)
        except ValueError:
            raise InputError(
                f"Cannot read the value range '{item}'.",
                "Write NAME=LOW,HIGH for one input (e.g. --value-range ids=0,30522) or LOW,HIGH for all.",
            ) from None
        if not low <= high:
            raise InputError(f"Value range '{item}': LOW must not exceed HIGH.", "Write LOW,HIGH with LOW <= HIGH.")
        out[name.strip() if sep else ""] = (low, high)
    return out


def load_feeds(
    model: Model,
    items: Sequence[str] = (),
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    preprocess: ImagePreprocess | None = None,
    seed: int = 0,
    value_ranges: Mapping[str, tuple[float, float]] | None = None,
) -> tuple[Model, dict[str, Any]]:
    """Read ``NAME=FILE`` / ``FILE`` / ``NAME=VALUE`` items, bind the shapes, synthesize the inputs not given.

    Returns the bound model and the validated feeds; :func:`prepare_feeds` also says where each came from.
    """
    feed_set = prepare_feeds(model, items, shapes=shapes, batch=batch, preprocess=preprocess, seed=seed,
                             value_ranges=value_ranges)
    return feed_set.model, feed_set.feeds


def prepare_feeds(
    model: Model,
    items: Sequence[str] = (),
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    preprocess: ImagePreprocess | None = None,
    seed: int = 0,
    value_ranges: Mapping[str, tuple[float, float]] | None = None,
) -> FeedSet:
    """Read the given inputs, bind the model's shapes, synthesize only the inputs not given.

    An item is ``NAME=FILE`` or a bare ``FILE`` (.npy, .npz, .pb, or an image), or ``NAME=VALUE``: a
    number or JSON list (``sr=16000``, ``mask=1``, ``ids=[1,2,3]``), a 0-d array for a scalar input, else
    filled to the bound shape. A bare ``FILE.npz`` supplies every input it has arrays for; a bare ``.npy``,
    ``.pb`` or image goes to the model's only input. Given values bind the symbolic dims of their inputs
    (unless ``shapes`` binds them); images are resized to the bound shape.
    """
    values: dict[str, Any] = {}
    origins: dict[str, tuple[str, str]] = {}
    fills: dict[str, np.ndarray] = {}
    images: dict[str, Path] = {}
    input_names = {s.name for s in model.inputs}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            name, text = "", item
        name = name.strip()
        path = Path(text).expanduser()
        if not path.is_file():
            target = name or (model.inputs[0].name if len(model.inputs) == 1 else "")
            literal = _parse_literal(text)
            if literal is _NOT_LITERAL or not target:
                raise InputError(
                    f"Input file not found: {text} (and it is not a literal value: a number or a JSON list)."
                    if literal is _NOT_LITERAL else f"--input {item}: say which input the value is for.",
                    "Give NAME=FILE (.npy, .npz, .pb or an image) or NAME=VALUE (a number such as 16000, or a "
                    "JSON list such as [1,2,3]); check the path if it is a file.",
                )
            _check_name(target, input_names)
            value = _literal_array(model.input(target), literal, text)
            if value.ndim == 0 and model.input(target).shape not in (None, ()):
                fills[target] = value
            else:
                values[target] = value
            origins[target] = ("literal", text)
            continue
        suffix = path.suffix.lower()
        if suffix == ".npz":
            content = read_npz(path)
            if name:
                if name not in content and len(content) == 1:
                    content = {name: next(iter(content.values()))}
                if name not in content:
                    raise InputError(
                        f"{path} has no array named '{name}' (it has: {', '.join(content)}).",
                        "Name the arrays in the .npz after the model's inputs.",
                    )
                content = {name: content[name]}
            values.update(content)
            origins.update({k: ("file", f"{path}[{k}]") for k in content})
            continue
        target = name or _target_of(model, path)
        _check_name(target, input_names)
        if suffix == ".npy":
            values[target] = read_npy(path)
        elif suffix == ".pb":
            values[target] = read_pb(path, model.input(target).type_proto)
        elif suffix in IMAGE_SUFFIXES:
            images[target] = path
        else:
            raise InputError(
                f"Cannot read {path}: unknown file type '{path.suffix}'.",
                "Use .npy, .npz, .pb or an image (" + ", ".join(sorted(IMAGE_SUFFIXES)) + ").",
            )
        origins[target] = ("image" if target in images else "file", str(path))
    unknown = sorted(set(values) - input_names)
    if unknown:
        raise InputError(
            f"Unknown input name(s) in the given files: {', '.join(unknown)}.",
            f"The model's inputs are: {', '.join(sorted(input_names))}.",
        )
    # Given tensors bind the symbolic dims of their inputs; one that contradicts a fixed dim binds nothing
    # and is reported by validate_feeds with the axis and both shapes.
    bindings = {}
    for key, value in values.items():
        spec = model.input(key)
        if spec.is_tensor and isinstance(value, np.ndarray) and _fits(spec, value):
            bindings[key] = tuple(value.shape)
    bindings.update(shapes or {})
    bound = model.bind(bindings, batch=batch)
    for target, value in fills.items():
        shape = bound.input_shapes.get(target)
        values[target] = np.full(shape, value, dtype=value.dtype) if shape is not None else value
    for target, path in images.items():
        values[target] = load_image(path, bound.input(target), bound.input_shapes.get(target),
                                    preprocess or ImagePreprocess())
    missing = [s.name for s in bound.inputs if s.name not in values]
    drawn = synthesize_described(bound, seed=seed, value_ranges=value_ranges, names=missing) if missing else {}
    for target, (value, how) in drawn.items():
        values[target] = value
        origins[target] = ("synthesized", how)
    feeds = validate_feeds(bound, values)
    result = []
    for spec in bound.inputs:
        source, detail = origins[spec.name]
        value = feeds[spec.name]
        shape = tuple(value.shape) if isinstance(value, np.ndarray) else None
        if source == "literal" and spec.name in fills:
            detail = f"{detail}, filled to the bound shape"
        result.append(FeedOrigin(spec.name, source, detail, shape,
                                 _dtype_text(spec.np_dtype) if spec.is_tensor else spec.type_text))
    return FeedSet(bound, feeds, result)


_NOT_LITERAL = object()


def _parse_literal(text: str) -> Any:
    """A number, true/false, or a JSON value (list, string); _NOT_LITERAL for anything else."""
    stripped = text.strip()
    lowered = stripped.lower()
    if lowered in ("nan", "inf", "+inf", "-inf"):
        return float(lowered)
    try:
        return json.loads(stripped)
    except ValueError:
        return _NOT_LITERAL


def _literal_array(spec: TensorSpec, literal: Any, text: str) -> np.ndarray:
    if not spec.is_tensor:
        raise InputError(
            f"Input '{spec.name}' is a {spec.type_text}; a literal value cannot be given for it.",
            f"Give it with --input {spec.name}=FILE.pb.",
        )
    dtype = spec.np_dtype
    try:
        if dtype.kind == "O":
            if not _all_strings(literal):
                raise TypeError("a string input takes JSON strings")
            return np.asarray(literal, dtype=object)
        array = np.asarray(literal)
        if array.dtype.kind not in "biuf":
            raise TypeError(array.dtype)
        converted = array.astype(dtype)
        if dtype.kind in "iub" and not np.array_equal(converted.astype(np.float64), array.astype(np.float64)):
            raise ValueError("not representable")
        return converted
    except (TypeError, ValueError, OverflowError):
        raise InputError(
            f"--input {spec.name}={text}: the value does not fit input '{spec.name}' of type {spec.type_text}.",
            "Give a number or a JSON list of numbers of the input's type"
            + (" (JSON strings for a string input, e.g. '[\"text\"]')." if dtype.kind == "O" else "."),
        ) from None


def _all_strings(value: Any) -> bool:
    if isinstance(value, list):
        return all(_all_strings(v) for v in value)
    return isinstance(value, str)


def _check_name(target: str, input_names: set[str]) -> None:
    if target not in input_names:
        raise InputError(
            f"--input names '{target}', which is not an input of the model.",
            f"Its inputs are: {', '.join(sorted(input_names))}.",
        )


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
            out[spec.name] = _check_tensor(model, spec, value)
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


def _check_tensor(model: Model, spec: TensorSpec, value: Any) -> np.ndarray:
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
            raise InputError(f"Input '{where}' expects {_dtype_text(want)}; the value given is "
                             f"{_dtype_text(arr.dtype)}.", hint)
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


def _dtype_text(dtype: np.dtype) -> str:
    return "string" if dtype.kind in "OUS" else dtype.name


def _fits(spec: TensorSpec, value: np.ndarray) -> bool:
    if spec.shape is None:
        return True
    return len(spec.shape) == value.ndim and all(
        not isinstance(d, int) or d == g for d, g in zip(spec.shape, value.shape))


def _target_of(model: Model, path: Path) -> str:
    """The input a bare FILE is for: the only input, or (for a .pb) the input its TensorProto names."""
    if len(model.inputs) == 1:
        return model.inputs[0].name
    if path.suffix.lower() == ".pb":
        proto = onnx.TensorProto()
        try:
            proto.ParseFromString(path.read_bytes())
        except Exception:  # noqa: BLE001 - not a tensor: fall through to the error below
            proto = onnx.TensorProto()
        if proto.name in {s.name for s in model.inputs}:
            return proto.name
    raise InputError(
        f"The model has {len(model.inputs)} inputs; say which one {path.name} is for.",
        f"Write --input NAME={path}; inputs: {', '.join(s.name for s in model.inputs)}.",
    )
