"""Image decoding on the CPU (Pillow) for `batch` and serve: uint8 HWC pixels at the preset's geometry, JPEGs
decoded at reduced size.

Why: decoding a 500x375 JPEG at full size and then shrinking it to 224 spends most of its time on pixels that
are thrown away. libjpeg scales by 1/2, 1/4 or 1/8 inside the inverse DCT; Pillow exposes it as
``Image.draft(mode, size)``, which picks the largest reduction that still leaves the image at least ``size``
(Pillow docs, Image.draft). The preset's geometry (inputs_files.read_pixels: imagenet resize + center crop, yolo
letterbox, scale01/none resize) then runs on the smaller image. The DCT-scaled pixels differ slightly from a full
decode + resize (tests/prepost/test_decode.py measures and bounds the difference on real photographs).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import BinaryIO

import numpy as np

from onnxaccel.errors import InputError
from onnxaccel.inputs_files import ImagePreprocess, apply_geometry, pillow


def draft_size(size: tuple[int, int], height: int, width: int, pre: ImagePreprocess) -> tuple[int, int]:
    """The smallest (width, height) the image (``size`` = width, height) may be decoded at so that the preset's
    geometry still only shrinks it: the resized size before the crop (imagenet), the letterboxed size (yolo),
    or the target size (scale01/none)."""
    w0, h0 = size
    if pre.preset == "imagenet":
        short = pre.resize or round(min(height, width) * 256 / 224)
        scale = short / min(w0, h0)
    elif pre.preset == "yolo":
        scale = min(height / h0, width / w0)
    else:
        return width, height
    return max(1, math.ceil(w0 * scale)), max(1, math.ceil(h0 * scale))


def decode_pixels(path: Path | BinaryIO, height: int, width: int, pre: ImagePreprocess, *,
                  reduced: bool = True) -> np.ndarray:
    """uint8 RGB pixels [height, width, 3] by the preset's geometry (read_pixels semantics); JPEGs decoded at
    reduced size (libjpeg DCT scaling) where the target is smaller, unless ``reduced`` is False."""
    Image = pillow()
    try:
        with Image.open(path) as img:
            if reduced and img.format == "JPEG":
                img.draft("RGB", draft_size(img.size, height, width, pre))
            img = img.convert("RGB")
            img, _ = apply_geometry(img, height, width, pre)
            return np.asarray(img, dtype=np.uint8)
    except OSError as exc:
        raise InputError(f"Cannot read image {path}: {exc}", "Check that the file is a valid image.") from exc


def decode_files_into(paths: list[str], out: np.ndarray, height: int, width: int,
                      pre: ImagePreprocess) -> dict[int, str]:
    """Decode ``paths`` on the CPU (decode_pixels) into rows 0.. of ``out``; a file that cannot be decoded is a zero
    row, its message under its row in the returned {row: message}."""
    bad = {}
    for i, path in enumerate(paths):
        try:
            out[i] = decode_pixels(path, height, width, pre)
        except InputError as exc:
            out[i] = 0
            bad[i] = exc.message
    return bad
