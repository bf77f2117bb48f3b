"""Reading feed files: images (by a preset: ImageNet resize/crop/normalize, YOLO letterbox, /255, or raw),
``.npy`` and ``.npz``. Split from inputs.py, which decides which file feeds which input and checks the result.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np

from onnxaccel.errors import InputError, MissingDependencyError
from onnxaccel.image_geometry import Letterbox, letterbox
from onnxaccel.model import TensorSpec

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: The presets ``--preprocess`` takes (docs/PREPROCESSING.md); ImagePreprocess.preset is one of them.
PRESETS = ("imagenet", "yolo", "scale01", "none")


@dataclass(frozen=True)
class ImagePreprocess:
    """How an image becomes a tensor. Defaults are torchvision's ImageNet evaluation transform.

    ``preset`` picks the geometry: ``imagenet`` resizes the shorter side to ``resize`` and center-crops,
    ``yolo`` letterboxes (aspect kept, ``pad_value`` gray), ``scale01`` and ``none`` resize to the input's
    size (a no-op when the input's H/W were bound by the image itself). Then ``pixel * scale``, minus
    ``mean``, over ``std``. ``size`` is the model's own H x W (Ultralytics ``imgsz``) for symbolic H/W;
    ``stride`` rounds an image's size up when it binds symbolic H/W. ``origin`` says who chose the preset
    (``--preprocess``, which metadata key, or the default), for the outputs.
    """

    resize: int | None = None  # shorter side before the crop; None = crop size * 256 / 224
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    scale: float = 1 / 255.0
    layout: str = "nchw"  # or "nhwc"
    channel_order: str = "rgb"  # or "bgr"
    preset: str = "imagenet"
    pad_value: int = 114
    stride: int = 32
    size: tuple[int, int] | None = None
    origin: str = ""

    def axes(self) -> tuple[int, int, int]:
        """The (H, W, C) axes of a 4-D image tensor in this layout."""
        return (2, 3, 1) if self.layout == "nchw" else (1, 2, 3)

    def natural_size(self, image_hw: tuple[int, int]) -> tuple[int, int]:
        """The H x W an image of ``image_hw`` binds symbolic H/W to: the model's ``size`` for yolo when
        known, the image's own size for ``none``, else the image's size rounded up to ``stride``."""
        if self.preset == "yolo" and self.size:
            return self.size
        if self.preset == "none":
            return image_hw
        return tuple(-(-d // self.stride) * self.stride for d in image_hw)  # type: ignore[return-value]

    def describe(self) -> str:
        """The preset and its parameters in one line, as `run` prints them."""
        parts = [self.preset]
        if self.preset == "imagenet":
            parts.append(f"resize {self.resize or 'crop*256/224'} + center crop")
        elif self.preset == "yolo":
            parts.append(f"letterbox pad {self.pad_value}")
        parts.append(f"x{self.scale:.6g}")
        if any(m != 0 for m in self.mean) or any(s != 1 for s in self.std):
            parts.append(f"mean {','.join(f'{m:g}' for m in self.mean)} std {','.join(f'{s:g}' for s in self.std)}")
        parts.append(f"{self.channel_order.upper()} {self.layout.upper()}")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        """The preset and its parameters, JSON-ready."""
        return {"preset": self.preset, "origin": self.origin, "resize": self.resize, "mean": list(self.mean),
                "std": list(self.std), "scale": self.scale, "layout": self.layout,
                "channel_order": self.channel_order, "pad_value": self.pad_value if self.preset == "yolo" else None,
                "stride": self.stride, "model_size": list(self.size) if self.size else None}


@dataclass(frozen=True)
class ImageInfo:
    """What preprocessing did to one image: its original size, the size fed, the crop or letterbox."""

    pre: ImagePreprocess
    original: tuple[int, int]  # width, height
    fed: tuple[int, int]  # width, height
    letterbox: Letterbox | None = None
    crop: tuple[int, int, int, int] | None = None  # left, top, right, bottom in the resized image
    resized: tuple[int, int] | None = None  # width, height before the crop
    source: str = ""  # the image file, for drawing on it

    def describe(self) -> str:
        """One line: preset, parameters and the geometry applied."""
        geometry = f"{self.original[0]}x{self.original[1]} -> {self.fed[0]}x{self.fed[1]}"
        if self.letterbox is not None:
            lb = self.letterbox
            geometry += f" (letterbox scale {lb.scale:.4g}, offset {lb.left},{lb.top})"
        elif self.crop is not None and self.resized is not None:
            geometry += f" (resized to {self.resized[0]}x{self.resized[1]}, center crop)"
        origin = f" [{self.pre.origin}]" if self.pre.origin else ""
        return f"preprocess {self.pre.describe()}; {geometry} (WxH){origin}"

    def to_dict(self) -> dict:
        """JSON-ready: the preset's parameters plus the geometry (letterbox scale and offset, crop)."""
        out = self.pre.to_dict()
        out.update(original_size=list(self.original), fed_size=list(self.fed),
                   letterbox=self.letterbox.to_dict() if self.letterbox else None,
                   crop=list(self.crop) if self.crop else None)
        return out


def image_size(path: Path | BinaryIO) -> tuple[int, int]:
    """(height, width) of an image file, read from its header."""
    Image = pillow()
    try:
        with Image.open(path) as img:
            return img.height, img.width
    except OSError as exc:
        raise InputError(f"Cannot read image {path}: {exc}", "Check that the file is a valid image.") from exc


def load_image(
    path: Path | BinaryIO, spec: TensorSpec, bound: tuple[int, ...] | None, pre: ImagePreprocess
) -> np.ndarray:
    """The image as the input's tensor (read_image without the record of what was done)."""
    return read_image(path, spec, bound, pre)[0]


def read_image(
    path: Path | BinaryIO, spec: TensorSpec, bound: tuple[int, ...] | None, pre: ImagePreprocess
) -> tuple[np.ndarray, ImageInfo]:
    """Resize/crop or letterbox to the input's H x W (``pre.preset``), scale, normalize, HWC -> CHW, add N."""
    shape = bound or spec.shape
    if shape is None or len(shape) != 4:
        raise InputError(
            f"Input '{spec.name}' {spec.shape_text()} is not a 4-D image tensor; cannot feed it an image.",
            "Feed it a .npy file instead.",
        )
    h_axis, w_axis, c_axis = pre.axes()
    height, width, channels = shape[h_axis], shape[w_axis], shape[c_axis]
    if not all(isinstance(d, int) and d > 0 for d in (height, width)):
        raise InputError(
            f"Input '{spec.name}' has no fixed height/width {spec.shape_text()}.",
            f"Bind them: --shape {spec.name}=1x3x224x224.",
        )
    if channels not in (3, None) and isinstance(channels, int) and channels > 0:
        raise InputError(f"Input '{spec.name}' has {channels} channels; images give 3.", "Feed a .npy instead.")
    pixels, info = read_pixels(path, height, width, pre)
    arr = pixels.astype(np.float32)
    if pre.channel_order == "bgr":
        arr = arr[..., ::-1]
    arr = (arr * np.float32(pre.scale) - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    if pre.layout == "nchw":
        arr = arr.transpose(2, 0, 1)
    batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else 1
    arr = np.repeat(arr[None], batch, axis=0)
    if isinstance(path, (str, Path)):
        info = replace(info, source=str(path))
    return np.ascontiguousarray(arr.astype(np.dtype(spec.dtype))), info


def read_pixels(path: Path | BinaryIO, height: int, width: int, pre: ImagePreprocess
                ) -> tuple[np.ndarray, ImageInfo]:
    """The preset's geometry only (resize and crop, or letterbox): uint8 RGB pixels [height, width, 3] and what
    was done. What a model with its preprocessing embedded takes (transform/embed_preprocess.py), and the first
    half of :func:`read_image`."""
    Image = pillow()
    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            img, info = apply_geometry(img, height, width, pre)
            return np.asarray(img, dtype=np.uint8), info
    except OSError as exc:
        raise InputError(f"Cannot read image {path}: {exc}", "Check that the file is a valid image.") from exc


def apply_geometry(img, height: int, width: int, pre: ImagePreprocess):
    """The RGB image at ``height`` x ``width`` by the preset's geometry, and what was done."""
    from PIL import Image

    original = img.size
    if pre.preset == "yolo":
        boxed, lb = letterbox(img, height, width, pre.pad_value)
        return boxed, ImageInfo(pre, original, (width, height), letterbox=lb)
    if pre.preset == "imagenet":
        short = pre.resize or round(min(height, width) * 256 / 224)
        scale = short / min(img.size)
        img = img.resize((max(width, round(img.width * scale)), max(height, round(img.height * scale))),
                         Image.BILINEAR)
        left, top = (img.width - width) // 2, (img.height - height) // 2
        crop = (left, top, left + width, top + height)
        return img.crop(crop), ImageInfo(pre, original, (width, height), crop=crop, resized=img.size)
    if img.size != (width, height):
        img = img.resize((width, height), Image.BILINEAR)
    return img, ImageInfo(pre, original, (width, height))


def pillow():
    """PIL.Image, or a MissingDependencyError naming the extra that brings Pillow."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingDependencyError("pillow", "image", "Reading images") from exc
    return Image


def read_npy(path: Path) -> np.ndarray:
    """A plain numeric array from a .npy file; pickled objects are refused (they can run code when loaded)."""
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise InputError(
            f"{path} holds Python objects (pickled data), which onnxaccel does not load.",
            "Save plain numeric arrays: np.save(path, np.asarray(x, dtype=np.float32)).",
        ) from exc
    except OSError as exc:
        raise InputError(f"{path} is not a valid .npy file: {exc}", "Write it with numpy.save.") from exc


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Name -> array from a .npz file; pickled objects are refused, as in ``read_npy``."""
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
