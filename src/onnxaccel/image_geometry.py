"""Image geometry shared by the feed readers (inputs_files.py) and the pre- and post-processing (prepost/):
letterbox resizing (YOLO's): scale the image to fit the model's size keeping its aspect ratio, pad the rest
with gray, and map boxes found in the padded frame back to the original image's pixels.

The arithmetic follows Ultralytics' ``LetterBox`` (ultralytics/ultralytics, ultralytics/data/augment.py,
class LetterBox.__call__, commit 359f87dc2431c61bac8be3774a6f41375219b556): ``r = min(H/h, W/w)``,
``new_unpad = round(w*r), round(h*r)``, centered padding with ``top = round(dh - 0.1)``,
``left = round(dw - 0.1)``, padding value 114. Ultralytics resizes with cv2.INTER_LINEAR; Pillow's
bilinear filter is used here, so pixel values differ slightly (boxes agree to a pixel or two).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image

PAD_VALUE = 114


@dataclass(frozen=True)
class Letterbox:
    """How an image of ``width`` x ``height`` was placed in the model's frame: scaled by ``scale``, then
    shifted by ``left``/``top`` pixels of padding."""

    scale: float
    left: int
    top: int
    width: int
    height: int

    def undo(self, boxes: np.ndarray) -> np.ndarray:
        """Boxes (x1, y1, x2, y2) in the letterboxed frame -> the original image's pixels, clipped to it."""
        out = np.asarray(boxes, dtype=np.float64).copy()
        out[..., [0, 2]] = (out[..., [0, 2]] - self.left) / self.scale
        out[..., [1, 3]] = (out[..., [1, 3]] - self.top) / self.scale
        out[..., [0, 2]] = out[..., [0, 2]].clip(0, self.width)
        out[..., [1, 3]] = out[..., [1, 3]].clip(0, self.height)
        return out

    def to_dict(self) -> dict:
        """JSON-ready form: scale, offset [left, top] and the original size [width, height]."""
        return {"scale": round(self.scale, 6), "offset": [self.left, self.top],
                "original_size": [self.width, self.height]}


def letterbox(img: Image.Image, height: int, width: int, pad_value: int = PAD_VALUE) -> tuple[Image.Image, Letterbox]:
    """``img`` (RGB) scaled to fit ``height`` x ``width`` with its aspect ratio kept, centered on gray."""
    from PIL import Image

    r = min(height / img.height, width / img.width)
    new_w, new_h = round(img.width * r), round(img.height * r)
    dw, dh = (width - new_w) / 2, (height - new_h) / 2
    left, top = round(dw - 0.1), round(dh - 0.1)
    resized = img if (new_w, new_h) == img.size else img.resize((new_w, new_h), Image.BILINEAR)
    canvas = Image.new("RGB", (width, height), (pad_value,) * 3)
    canvas.paste(resized, (left, top))
    return canvas, Letterbox(r, left, top, img.width, img.height)
