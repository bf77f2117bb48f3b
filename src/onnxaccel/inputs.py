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

import numpy as np
import onnx

from onnxaccel.errors import InputError
# The file readers live in inputs_files; IMAGE_SUFFIXES, ImagePreprocess and load_image are
# re-exported because calibration, the CLI, pipeline, scale and transform import them from here.
from onnxaccel.inputs_files import (  # noqa: F401
    IMAGE_SUFFIXES, PRESETS, ImageInfo, ImagePreprocess, color_text, image_size, load_image,
    read_image, read_npy, read_npz,
)
from onnxaccel.feeds_check import check_tensor, dtype_text, fits, validate_feeds
from onnxaccel.model import Model, TensorSpec
from onnxaccel.prepost.presets import PreprocessRequest, resolve_preprocess
from onnxaccel.protobuf_values import read_pb
from onnxaccel.synthesis import synthesize, synthesize_described

__all__ = ["FeedOrigin", "FeedSet", "ImagePreprocess", "PreprocessRequest", "load_feeds", "load_image",
           "parse_value_ranges",
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
    #: For an image: the preset, its parameters and the geometry applied (letterbox, crop).
    image: ImageInfo | None = field(default=None, compare=False)

    @property
    def synthesized(self) -> bool:
        """True when the feed was generated rather than given."""
        return self.source == "synthesized"

    def describe(self) -> str:
        """One line saying where the feed came from and its type and shape."""
        shape = "x".join(map(str, self.shape)) if self.shape else ("scalar" if self.shape == () else "")
        what = f"{self.type} {shape}".strip()
        return f"{self.name}: {what}, {self.source} ({self.detail})"

    @property
    def note(self) -> str | None:
        """For an image fed without a preset (none by default): what was fed and how to choose one."""
        info = self.image
        if info is None or info.pixels or info.pre.preset != "none" or not info.pre.origin.startswith("default"):
            return None
        color = color_text(info.channels, info.pre.channel_order)
        return (f"input '{self.name}': image fed as raw pixel values 0..255 (float, {color}, "
                f"{info.pre.layout.upper()}, {info.fed[0]}x{info.fed[1]}) because the model's metadata names no "
                f"preprocessing; choose one with --preprocess {'|'.join(PRESETS)}")

    def to_dict(self) -> dict:
        """JSON-ready form of the origin; images add ``preprocess`` (preset, parameters, geometry)."""
        out = {"name": self.name, "source": self.source, "detail": self.detail,
               "shape": list(self.shape) if self.shape is not None else None, "type": self.type}
        if self.image is not None:
            out["preprocess"] = self.image.to_dict()
        return out


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
    preprocess: ImagePreprocess | PreprocessRequest | None = None,
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
    preprocess: ImagePreprocess | PreprocessRequest | None = None,
    seed: int = 0,
    value_ranges: Mapping[str, tuple[float, float]] | None = None,
) -> FeedSet:
    """Read the given inputs, bind the model's shapes, synthesize only the inputs not given.

    An item is ``NAME=FILE`` or a bare ``FILE`` (.npy, .npz, .pb, or an image), or ``NAME=VALUE``: a
    number or JSON list (``sr=16000``, ``mask=1``, ``ids=[1,2,3]``), a 0-d array for a scalar input, else
    filled to the bound shape. A bare ``FILE.npz`` supplies every input it has arrays for; a bare ``.npy``,
    ``.pb`` or image goes to the model's only input. Given values bind the symbolic dims of their inputs
    (unless ``shapes`` binds them); images bind symbolic H/W by their size after preprocessing
    (``ImagePreprocess.natural_size``) and are then resized, cropped or letterboxed to the bound shape.
    ``preprocess``: an ImagePreprocess is used as given; a PreprocessRequest or None is resolved against
    the model's metadata (prepost.presets). Rank, fixed-dim and dtype mismatches of given arrays are
    reported before anything about unbound dims.
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
            spec = model.input(target)
            values[target] = read_pb(path, spec.type_proto, what=f"input '{target}' ({spec.type_text})")
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
    # Rank, fixed dims and dtype first: a wrong array is reported as such, not as the dims it left unbound.
    for key, value in values.items():
        spec = model.input(key)
        if spec.is_tensor and isinstance(value, np.ndarray):
            check_tensor(model, spec, value)
    # Given tensors bind the symbolic dims of their inputs; images theirs by their size after preprocessing.
    bindings: dict[str, tuple[int, ...]] = {}
    for key, value in values.items():
        spec = model.input(key)
        if spec.is_tensor and isinstance(value, np.ndarray) and fits(spec, value):
            bindings[key] = tuple(value.shape)
    first = model.input(next(iter(images))) if images else None
    pre = resolve_preprocess(model.metadata, preprocess, first.shape if first is not None else None) if images \
        else ImagePreprocess()
    for target, path in images.items():
        bindings.update(_image_bindings(model.input(target), path, pre, shapes or {}, batch))
    bindings.update(shapes or {})
    bound = model.bind(bindings, batch=batch)
    for target, value in fills.items():
        shape = bound.input_shapes.get(target)
        values[target] = np.full(shape, value, dtype=value.dtype) if shape is not None else value
    infos: dict[str, ImageInfo] = {}
    for target, path in images.items():
        values[target], infos[target] = read_image(path, bound.input(target), bound.input_shapes.get(target), pre)
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
        if spec.name in infos:
            detail = f"{detail}; {infos[spec.name].describe()}"
        result.append(FeedOrigin(spec.name, source, detail, shape,
                                 dtype_text(spec.np_dtype) if spec.is_tensor else spec.type_text,
                                 image=infos.get(spec.name)))
    return FeedSet(bound, feeds, result)


def _image_bindings(spec: TensorSpec, path: Path, pre: ImagePreprocess, shapes: Mapping[str, Sequence[int]],
                    batch: int | None) -> dict[str, tuple[int, ...]]:
    """Bindings for an image input's symbolic H/W from the image's size after preprocessing: the dim names
    (``height=(640,)``), or the input's full shape where a dim has no name. Nothing for dims ``shapes``
    binds or for an input that is not a 4-D image tensor (read_image reports that)."""
    if not spec.is_tensor or spec.shape is None or len(spec.shape) != 4 or spec.name in shapes:
        return {}
    h_axis, w_axis, c_axis = pre.axes()
    free = [axis for axis in (h_axis, w_axis)
            if not (isinstance(spec.shape[axis], int) and spec.shape[axis] > 0) and spec.shape[axis] not in shapes]
    if not free:
        return {}
    natural = dict(zip((h_axis, w_axis), pre.natural_size(image_size(path))))
    if all(isinstance(spec.shape[axis], str) for axis in free):
        return {spec.shape[axis]: (natural[axis],) for axis in free}
    full = []
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int) and dim > 0:
            full.append(dim)
        elif isinstance(dim, str) and dim in shapes:
            full.append(int(shapes[dim][0]))
        else:
            full.append(natural.get(axis) or (3 if axis == c_axis else (batch or 1)))
    return {spec.name: tuple(full)}


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
