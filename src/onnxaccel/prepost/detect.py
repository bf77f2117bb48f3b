"""Decoding YOLOv8 detection outputs: [N, 4 + C, anchors] (cx, cy, w, h, then one score per class, no
objectness), confidence filter, per-class NMS, and the letterbox undone to the original image's pixels.

Boxes are offset per class (by 7680 px, larger than any input) so one class-agnostic NMS keeps classes
apart; the NMS is a greedy one over a vectorized IoU matrix (numpy). Defaults: confidence 0.25, IoU 0.45.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from onnxaccel.errors import InputError
from onnxaccel.image_geometry import Letterbox
from onnxaccel.prepost.post_options import DEFAULT_CONF, DEFAULT_IOU


@dataclass(frozen=True)
class Detection:
    """One detection: class id and name, score, box (x1, y1, x2, y2) in the original image's pixels (or the
    model's input frame when no letterbox is known)."""

    class_id: int
    label: str
    score: float
    box: tuple[float, float, float, float]

    def to_dict(self) -> dict:
        """JSON-ready form: class, class_id, score, box [x1, y1, x2, y2]."""
        return {"class": self.label, "class_id": self.class_id, "score": round(self.score, 6),
                "box": [round(v, 2) for v in self.box]}


def decode_yolov8(output: np.ndarray, *, conf: float = DEFAULT_CONF, iou: float = DEFAULT_IOU,
                  names: Mapping[int, str] | None = None, letterbox: Letterbox | None = None,
                  max_det: int = 300) -> list[list[Detection]]:
    """Detections per image of a YOLOv8 output [N, 4 + C, anchors]."""
    out = np.asarray(output, dtype=np.float32)
    if out.ndim != 3 or out.shape[1] < 5:
        raise InputError(
            f"--postprocess detect expects a YOLOv8 output [N, 4 + classes, anchors]; this one has shape "
            f"{list(out.shape)}.", "Use --postprocess none (or topk) for this model.")
    results = []
    for pred in out:
        pred = pred.T  # anchors x (4 + C)
        scores = pred[:, 4:]
        cls = scores.argmax(axis=1)
        best = scores[np.arange(len(cls)), cls]
        keep = best > conf
        boxes, best, cls = _xyxy(pred[keep, :4]), best[keep], cls[keep]
        order = np.argsort(-best, kind="stable")
        boxes, best, cls = boxes[order], best[order], cls[order]
        offset = cls[:, None].astype(np.float32) * 7680.0  # Ultralytics' max_wh: classes never overlap
        kept = nms(boxes + offset, iou)[:max_det]
        final = letterbox.undo(boxes[kept]) if letterbox is not None else boxes[kept].astype(np.float64)
        results.append([Detection(int(c), (names or {}).get(int(c), str(int(c))), float(s), tuple(map(float, b)))
                        for b, s, c in zip(final, best[kept], cls[kept])])
    return results


def _xyxy(cxcywh: np.ndarray) -> np.ndarray:
    cx, cy, w, h = cxcywh.T
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def nms(boxes: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Indices kept by greedy NMS over ``boxes`` (x1, y1, x2, y2) already sorted by descending score."""
    n = len(boxes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    ious = box_iou(boxes, boxes)
    suppressed = np.zeros(n, dtype=bool)
    keep = []
    for i in range(n):
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= ious[i] > iou_threshold
    return np.asarray(keep, dtype=np.int64)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of boxes ``a`` [M, 4] and ``b`` [K, 4] (x1, y1, x2, y2) -> [M, K]."""
    a, b = np.asarray(a, np.float64)[:, None], np.asarray(b, np.float64)[None]
    w = (np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0])).clip(0)
    h = (np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1])).clip(0)
    inter = w * h
    area = lambda x: (x[..., 2] - x[..., 0]).clip(0) * (x[..., 3] - x[..., 1]).clip(0)  # noqa: E731
    return inter / np.maximum(area(a) + area(b) - inter, 1e-12)
