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

    def describe(self, channels: int = 3) -> str:
        """The preset and its parameters in one line, as `run` prints them (``channels``: those fed)."""
        parts = [self.preset]
        if self.preset == "imagenet":
            parts.append(f"resize {self.resize or 'crop*256/224'} + center crop")
        elif self.preset == "yolo":
            parts.append(f"letterbox pad {self.pad_value}")
        parts.append(f"x{self.scale:.6g}")
        if any(m != 0 for m in self.mean) or any(s != 1 for s in self.std):
            parts.append(f"mean {','.join(f'{m:g}' for m in self.mean)} std {','.join(f'{s:g}' for s in self.std)}")
        parts.append(f"{color_text(channels, self.channel_order)} {self.layout.upper()}")
        return ", ".join(parts)

    def geometry_warning(self) -> str | None:
        """What the preset's geometry does to an image of another size than the model's (a job over many images
        says it once): imagenet crops, none and scale01 stretch; yolo letterboxes (nothing lost)."""
        if self.preset == "imagenet":
            return ("preprocess imagenet resizes each image's short side and center-crops it to the model's size: "
                    "images of another aspect ratio lose their borders (images already at the model's size are fed "
                    "as they are)")
        if self.preset in ("none", "scale01"):
            return (f"preprocess {self.preset} resizes each image to the model's size: images of another aspect "
                    "ratio are stretched")
        return None

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
    #: The channels fed (1 grayscale, 3 RGB/BGR, 4 RGBA/BGRA) and whether they were fed as uint8 pixels without
    #: scale or normalization (an integer input: the model normalizes, e.g. optimize --embed-preprocess).
    channels: int = 3
    pixels: bool = False

    @property
    def warning(self) -> str | None:
        """What the geometry changed beyond a size: the aspect ratio (a plain resize to another ratio) or the
        content (a center crop); None when it kept both (no resize, an aspect-preserving resize, a letterbox)."""
        (w0, h0), (w1, h1) = self.original, self.fed
        if self.crop is not None and self.resized is not None and tuple(self.resized) != tuple(self.fed):
            rw, rh = self.resized
            return (f"preprocess {self.pre.preset} cropped the image: {w0}x{h0} resized to {rw}x{rh}, center "
                    f"{w1}x{h1} kept ({rw - w1} px of width, {rh - h1} px of height cut)")
        if self.letterbox is None and self.crop is None and abs(w0 * h1 - w1 * h0) > max(w0, h0):
            return (f"preprocess {self.pre.preset} changed the aspect ratio: {w0}x{h0} ({w0 / h0:.3g}) resized to "
                    f"{w1}x{h1} ({w1 / h1:.3g})")
        return None

    def describe(self) -> str:
        """One line: preset, parameters and the geometry applied."""
        geometry = f"{self.original[0]}x{self.original[1]} -> {self.fed[0]}x{self.fed[1]}"
        if self.original == self.fed and self.letterbox is None:
            geometry += " (already the model's size: not resized)"
        elif self.letterbox is not None:
            lb = self.letterbox
            geometry += f" (letterbox scale {lb.scale:.4g}, offset {lb.left},{lb.top})"
        elif self.crop is not None and self.resized is not None:
            geometry += f" (resized to {self.resized[0]}x{self.resized[1]}, center crop)"
        origin = f" [{self.pre.origin}]" if self.pre.origin else ""
        what = self.pre.describe(self.channels)
        if self.pixels:
            what = f"{self.pre.preset} geometry, uint8 pixels as decoded (no scale or normalization: the model " \
                   f"does its own), {color_text(self.channels, self.pre.channel_order)} {self.pre.layout.upper()}"
        return f"preprocess {what}; {geometry} (WxH){origin}"

    def to_dict(self) -> dict:
        """JSON-ready: the preset's parameters plus the geometry (letterbox scale and offset, crop)."""
        out = self.pre.to_dict()
        out.update(original_size=list(self.original), fed_size=list(self.fed),
                   letterbox=self.letterbox.to_dict() if self.letterbox else None,
                   crop=list(self.crop) if self.crop else None,
                   resized_size=list(self.resized) if self.resized else None,
                   resized=tuple(self.resized or self.fed) != tuple(self.original), channels=self.channels,
                   color=color_text(self.channels, self.pre.channel_order), pixels_uint8=self.pixels,
                   warning=self.warning)
        if self.pixels:
            out.update(scale=1.0, mean=None, std=None)
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
    channels = channels if isinstance(channels, int) and channels > 0 else 3
    if channels not in MODES:
        other = "nchw" if pre.layout == "nhwc" else "nhwc"
        raise InputError(f"Input '{spec.name}' {spec.shape_text()} has {channels} channels on axis {c_axis} "
                         f"({pre.layout.upper()}); images give 1 (grayscale), 3 (RGB) or 4 (RGBA).",
                         f"If its layout is {other.upper()}, pass --layout {other}; else feed a .npy file.")
    pixels, info = read_pixels(path, height, width, pre, channels=channels)
    dtype = np.dtype(spec.dtype)
    if dtype.kind in "iu":  # integer pixels: the model scales and normalizes them itself
        arr = pixels.astype(dtype)
        info = replace(info, pixels=True)
    else:
        arr = pixels.astype(np.float32)
        mean, std = per_channel(pre.mean, channels, "--mean"), per_channel(pre.std, channels, "--std")
        arr = (arr * np.float32(pre.scale) - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    if pre.layout == "nchw":
        arr = arr.transpose(2, 0, 1)
    batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else 1
    arr = np.repeat(arr[None], batch, axis=0)
    if isinstance(path, (str, Path)):
        info = replace(info, source=str(path))
    return np.ascontiguousarray(arr.astype(dtype)), info


#: Pillow's mode per channel count an image input may have.
MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def color_text(channels: int, order: str) -> str:
    """How the channels fed are named: grayscale, RGB, BGR, RGBA, BGRA."""
    if channels == 1:
        return "grayscale"
    return order.upper() + ("A" if channels == 4 else "")


def per_channel(values: tuple[float, ...], channels: int, flag: str) -> tuple[float, ...]:
    """Mean or std values for ``channels`` channels: as given when the counts match; one value for every channel
    when they are all equal; their average for a grayscale input; alpha left as is (0 mean, 1 std) for RGBA."""
    values = tuple(values)
    if len(values) == channels:
        return values
    if len(set(values)) == 1:
        return (values[0],) * channels
    if channels == 1:
        return (sum(values) / len(values),)
    if channels == 4 and len(values) == 3:
        return (*values, 0.0 if flag == "--mean" else 1.0)
    raise InputError(f"{flag} gives {len(values)} values; the image input has {channels} channels.",
                     f"Give {channels} values (or one), e.g. {flag} {','.join(['0.5'] * channels)}.")


def read_pixels(path: Path | BinaryIO, height: int, width: int, pre: ImagePreprocess, *, channels: int = 3
                ) -> tuple[np.ndarray, ImageInfo]:
    """The preset's geometry only (resize and crop, or letterbox): uint8 pixels [height, width, channels] and what
    was done. ``channels``: 1 grayscale, 3 RGB, 4 RGBA (BGR/BGRA for ``pre.channel_order`` bgr). What a model
    with its preprocessing embedded takes (transform/embed_preprocess.py), and the first half of
    :func:`read_image`."""
    Image = pillow()
    try:
        with Image.open(path) as img:
            img = img.convert(MODES.get(channels, "RGB"))
            img, info = apply_geometry(img, height, width, pre)
            pixels = np.asarray(img, dtype=np.uint8)
            pixels = pixels[..., None] if pixels.ndim == 2 else pixels
            if pre.channel_order == "bgr" and channels >= 3:
                pixels = np.concatenate([pixels[..., 2::-1], pixels[..., 3:]], axis=-1)
            return pixels, replace(info, channels=channels)
    except OSError as exc:
        raise InputError(f"Cannot read image {path}: {exc}", "Check that the file is a valid image.") from exc


def apply_geometry(img, height: int, width: int, pre: ImagePreprocess):
    """The RGB image at ``height`` x ``width`` by the preset's geometry, and what was done."""
    from PIL import Image

    original = img.size
    if original == (width, height) and pre.preset != "yolo":  # already the model's size: fed as it is
        return img, ImageInfo(pre, original, (width, height))
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
