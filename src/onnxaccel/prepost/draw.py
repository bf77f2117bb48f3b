"""Drawing detections on the original image with Pillow (``run --draw out.jpg``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from onnxaccel.errors import InputError, MissingDependencyError
from onnxaccel.prepost.detect import Detection

_COLORS = ((255, 56, 56), (56, 56, 255), (56, 200, 56), (255, 157, 151), (255, 178, 29), (207, 210, 49))


def draw_detections(image: Path, detections: Sequence[Detection], dest: Path) -> Path:
    """Write ``image`` with each detection's box and "label score" to ``dest`` (format from its suffix)."""
    try:
        from PIL import Image, ImageDraw
    except ImportError as exc:
        raise MissingDependencyError("pillow", "image", "Drawing detections") from exc
    with Image.open(image) as src:
        canvas = src.convert("RGB")
    pen = ImageDraw.Draw(canvas)
    width = max(2, round(max(canvas.size) / 250))
    for det in detections:
        color = _COLORS[det.class_id % len(_COLORS)]
        x1, y1, x2, y2 = det.box
        pen.rectangle((x1, y1, x2, y2), outline=color, width=width)
        text = f"{det.label} {det.score:.2f}"
        left, top, right, bottom = pen.textbbox((x1, y1), text)
        top_y = y1 - (bottom - top) - 4 if y1 - (bottom - top) - 4 >= 0 else y1
        pen.rectangle((x1, top_y, x1 + (right - left) + 4, top_y + (bottom - top) + 4), fill=color)
        pen.text((x1 + 2, top_y + 1), text, fill=(255, 255, 255))
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        canvas.save(dest)
    except (ValueError, OSError) as exc:
        raise InputError(f"Cannot write {dest}: {exc}",
                         "Use --draw FILE.jpg or FILE.png in a writable folder.") from exc
    return dest
