"""The post-processing choices `run` offers and the detection thresholds' defaults: plain values, no imports,
so the command line can build ``--postprocess``, ``--conf`` and ``--iou`` (their help and defaults) without
loading numpy or the decoders (prepost/post.py and prepost/detect.py use them from here)."""

from __future__ import annotations

#: ``--postprocess`` values: ImageNet-style top-k, YOLOv8 detections, or none.
POSTPROCESS = ("topk", "detect", "none")
#: Detection score threshold and NMS IoU threshold (``--conf``, ``--iou``).
DEFAULT_CONF = 0.25
DEFAULT_IOU = 0.45
