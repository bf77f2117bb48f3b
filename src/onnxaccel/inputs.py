"""Feeds: synthesize them from a bound signature, or load them from .npy/.npz files and images.

Every feed is checked against the model's signature: a wrong name, rank, size or dtype is an InputError
that says which input, what it expects and what it got.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxaccel.errors import InputError, MissingDependencyError
from onnxaccel.model import Model, TensorSpec

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImagePreprocess:
    """How an image becomes a tensor. Defaults are torchvision's ImageNet evaluation transform."""

    resize: int | None = None  # shorter side before the crop; None = crop size * 256 / 224
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    scale: float = 1 / 255.0
    layout: str = "nchw"  # or "nhwc"
    channel_order: str = "rgb"  # or "bgr"


def synthesize(model: Model, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for every input at its bound shape. Integer inputs get values a model accepts.

    Names decide the values of integer inputs, as onnxruntime_perf_test and Olive do: ``*mask*`` gets ones,
    ``*type*``/``*segment*`` zeros, other integers (token ids) small non-negative values; floats are
    uniform in [0, 1) (image-like), booleans random.
    """
    if not model.is_bound:
        model = model.bind()
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in model.inputs:
        shape = model.input_shapes[spec.name]
        feeds[spec.name] = _random_tensor(spec, shape, rng)
    return feeds


def _random_tensor(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    name = spec.name.lower()
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        if "mask" in name:
            return np.ones(shape, dtype=dtype)
        if "type" in name or "segment" in name:
            return np.zeros(shape, dtype=dtype)
        return rng.integers(0, 1000, size=shape).astype(dtype)
    if dtype.kind == "f":
        return rng.random(shape, dtype=np.float32).astype(dtype)
    raise InputError(
        f"Cannot synthesize input '{spec.name}' of type {spec.dtype}.",
        f"Give it with --input {spec.name}=FILE.npy.",
    )


def load_feeds(
    model: Model,
    items: Sequence[str] = (),
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    preprocess: ImagePreprocess | None = None,
    seed: int = 0,
) -> tuple[Model, dict[str, np.ndarray]]:
    """Read ``NAME=FILE`` / ``FILE`` items, bind the model's shapes, synthesize the inputs not given.

    Arrays from files bind the symbolic dims of their inputs (unless ``shapes`` binds them); images are
    resized to the bound shape. A bare ``FILE.npz`` supplies every input it has arrays for; a bare
    ``FILE.npy`` or image goes to the model's only input (an error when there are several).
    Returns the bound model and the validated feeds.
    """
    arrays: dict[str, np.ndarray] = {}
    images: dict[str, Path] = {}
    input_names = {s.name for s in model.inputs}
    for item in items:
        name, sep, path_text = item.partition("=")
        if not sep:
            name, path_text = "", item
        path = Path(path_text).expanduser()
        if not path.is_file():
            raise InputError(f"Input file not found: {path_text}", "Check the path after --input NAME=.")
        suffix = path.suffix.lower()
        if suffix == ".npz":
            content = _read_npz(path)
            if name:
                if name not in content and len(content) == 1:
                    content = {name: next(iter(content.values()))}
                if name not in content:
                    raise InputError(
                        f"{path} has no array named '{name}' (it has: {', '.join(content)}).",
                        "Name the arrays in the .npz after the model's inputs.",
                    )
                content = {name: content[name]}
            arrays.update(content)
            continue
        target = name or _only_input(model, path)
        if target not in input_names:
            raise InputError(
                f"--input names '{target}', which is not an input of the model.",
                f"Its inputs are: {', '.join(sorted(input_names))}.",
            )
        if suffix == ".npy":
            arrays[target] = _read_npy(path)
        elif suffix in IMAGE_SUFFIXES:
            images[target] = path
        else:
            raise InputError(
                f"Cannot read {path}: unknown file type '{path.suffix}'.",
                "Use .npy, .npz or an image (" + ", ".join(sorted(IMAGE_SUFFIXES)) + ").",
            )
    unknown = sorted(set(arrays) - input_names)
    if unknown:
        raise InputError(
            f"Unknown input name(s) in the given files: {', '.join(unknown)}.",
            f"The model's inputs are: {', '.join(sorted(input_names))}.",
        )
    # Arrays bind the symbolic dims of their inputs; an array that contradicts a fixed dim binds nothing
    # and is reported by validate_feeds with the axis and both shapes.
    bindings = {k: tuple(v.shape) for k, v in arrays.items() if _fits(model.input(k), v)}
    bindings.update(shapes or {})
    bound = model.bind(bindings, batch=batch)
    feeds = synthesize(bound, seed=seed)
    feeds.update(arrays)
    for target, path in images.items():
        feeds[target] = load_image(path, bound.input(target), bound.input_shapes[target],
                                   preprocess or ImagePreprocess())
    return bound, validate_feeds(bound, feeds)


def validate_feeds(model: Model, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Check names, dtypes and shapes against the signature; cast only when the cast is lossless."""
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
        arr = np.asarray(feeds[spec.name])
        want = np.dtype(spec.dtype)
        if arr.dtype != want:
            if not np.can_cast(arr.dtype, want, casting="safe"):
                raise InputError(
                    f"Input '{spec.name}' expects {want.name}; the value given is {arr.dtype.name}.",
                    f"Save it as {want.name}, e.g. np.save(path, array.astype(np.{want.name})).",
                )
            arr = arr.astype(want)
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
        out[spec.name] = np.ascontiguousarray(arr)
    return out


def _fits(spec: TensorSpec, value: np.ndarray) -> bool:
    if spec.shape is None:
        return True
    return len(spec.shape) == value.ndim and all(
        not isinstance(d, int) or d == g for d, g in zip(spec.shape, value.shape))


def load_image(
    path: Path, spec: TensorSpec, bound: tuple[int, ...] | None, pre: ImagePreprocess
) -> np.ndarray:
    """Resize the shorter side, center-crop to the input's H x W, scale, normalize, HWC -> CHW, add N."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError("pillow", "image", "Reading images") from exc
    shape = bound or spec.shape
    if shape is None or len(shape) != 4:
        raise InputError(
            f"Input '{spec.name}' {spec.shape_text()} is not a 4-D image tensor; cannot feed it an image.",
            "Feed it a .npy file instead.",
        )
    h_axis, w_axis, c_axis = (2, 3, 1) if pre.layout == "nchw" else (1, 2, 3)
    height, width, channels = shape[h_axis], shape[w_axis], shape[c_axis]
    if not all(isinstance(d, int) and d > 0 for d in (height, width)):
        raise InputError(
            f"Input '{spec.name}' has no fixed height/width {spec.shape_text()}.",
            f"Bind them: --shape {spec.name}=1x3x224x224.",
        )
    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            short = pre.resize or round(min(height, width) * 256 / 224)
            scale = short / min(img.size)
            img = img.resize((max(width, round(img.width * scale)), max(height, round(img.height * scale))),
                             Image.BILINEAR)
            left, top = (img.width - width) // 2, (img.height - height) // 2
            img = img.crop((left, top, left + width, top + height))
            arr = np.asarray(img, dtype=np.float32)
    except OSError as exc:
        raise InputError(f"Cannot read image {path}: {exc}", "Check that the file is a valid image.") from exc
    if pre.channel_order == "bgr":
        arr = arr[..., ::-1]
    if channels not in (3, None) and isinstance(channels, int):
        raise InputError(f"Input '{spec.name}' has {channels} channels; images give 3.", "Feed a .npy instead.")
    arr = (arr * pre.scale - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    if pre.layout == "nchw":
        arr = arr.transpose(2, 0, 1)
    batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else 1
    arr = np.repeat(arr[None], batch, axis=0)
    return np.ascontiguousarray(arr.astype(np.dtype(spec.dtype)))


def _read_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise InputError(
            f"{path} holds Python objects (pickled data), which onnxaccel does not load.",
            "Save plain numeric arrays: np.save(path, np.asarray(x, dtype=np.float32)).",
        ) from exc
    except OSError as exc:
        raise InputError(f"{path} is not a valid .npy file: {exc}", "Write it with numpy.save.") from exc


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except ValueError as exc:
        raise InputError(
            f"{path} holds Python objects (pickled data), which onnxaccel does not load.",
            "Save plain numeric arrays with numpy.savez.",
        ) from exc
    except (OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path} is not a valid .npz file: {exc}", "Write it with numpy.savez.") from exc


def _only_input(model: Model, path: Path) -> str:
    if len(model.inputs) == 1:
        return model.inputs[0].name
    raise InputError(
        f"The model has {len(model.inputs)} inputs; say which one {path.name} is for.",
        f"Write --input NAME={path}; inputs: {', '.join(s.name for s in model.inputs)}.",
    )
