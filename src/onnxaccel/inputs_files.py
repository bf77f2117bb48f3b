"""Reading feed files: images (resized, cropped, normalized like torchvision's ImageNet evaluation transform),
``.npy`` and ``.npz``. Split from inputs.py, which decides which file feeds which input and checks the result.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxaccel.errors import InputError, MissingDependencyError
from onnxaccel.model import TensorSpec

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
