"""Post-processing of `run`'s outputs: which one applies (``--postprocess`` or the model), and its result.

Default: ``detect`` when Ultralytics metadata says task=detect, ``topk`` when an output is a classification
(:func:`classification_outputs`: [N, 1000] or [N, 1001] ImageNet scores, [N, C] with C class names in the
metadata (prepost/class_names.py), or [N, C] computed by a final Softmax), else ``none``: an embedding or any
other tensor is summarised (shape, norm, min/max), never ranked.
Top-k names its classes by the metadata's class names when their count matches, else ImageNet's for 1000
classes, else shows indices only (with a note when the metadata's names did not match).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnxaccel.errors import InputError
from onnxaccel.inputs_files import ImageInfo
from onnxaccel.prepost.class_names import class_names
from onnxaccel.prepost.detect import Detection, decode_yolov8
from onnxaccel.prepost.draw import draw_detections
from onnxaccel.prepost.post_options import DEFAULT_CONF, DEFAULT_IOU, POSTPROCESS
from onnxaccel.prepost.presets import ultralytics_meta
from onnxaccel.prepost.topk import IMAGENET_CLASSES, Ranked, classifier_rows, topk


@dataclass
class PostResult:
    """What post-processing found: the kind, who chose it, and top-k rows or detections per image."""

    kind: str
    origin: str
    output: str | None = None
    topk: list[list[Ranked]] = field(default_factory=list)
    detections: list[list[Detection]] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    drawn: str | None = None
    notes: list[str] = field(default_factory=list)
    #: Where top-k's class names came from ("metadata 'names'", "ImageNet"); None for indices only.
    labels: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready form (the ``postprocess`` entry of `run --json`)."""
        out: dict = {"kind": self.kind, "origin": self.origin, "output": self.output, "params": self.params,
                     "notes": self.notes}
        if self.kind == "topk":
            out["topk"] = [[r.to_dict() for r in row] for row in self.topk]
            out["labels"] = self.labels
        if self.kind == "detect":
            out["detections"] = [[d.to_dict() for d in dets] for dets in self.detections]
            out["drawn"] = self.drawn
        return out


#: Ops an output may pass through after its Softmax and still be the classifier's probabilities.
_PASS_THROUGH = {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast"}
#: Class counts of ImageNet classifiers: 1000, and 1001 with a background class (TF-slim's).
IMAGENET_COUNTS = (IMAGENET_CLASSES, IMAGENET_CLASSES + 1)


def softmax_outputs(graph) -> set[str]:
    """The graph outputs computed by a Softmax or LogSoftmax, through reshapes, casts and identities."""
    producer = {out: node for node in graph.node for out in node.output}
    found = set()
    for output in graph.output:
        node = producer.get(output.name)
        while node is not None and node.op_type in _PASS_THROUGH and node.input:
            node = producer.get(node.input[0])
        if node is not None and node.op_type in ("Softmax", "LogSoftmax"):
            found.add(output.name)
    return found


def classification_outputs(metadata: Mapping[str, str], outputs: Mapping[str, object], graph=None
                           ) -> dict[str, str]:
    """Output name -> why it is a classification, for the [N, C] float outputs that are one: C of ImageNet's
    counts, C classes named by the metadata, or (``graph`` given) a final Softmax."""
    named = class_names(metadata)
    softmax = softmax_outputs(graph) if graph is not None else set()
    found = {}
    for name, value in outputs.items():
        rows = classifier_rows(value) if isinstance(value, np.ndarray) else None
        if rows is None:
            continue
        classes = rows.shape[1]
        if classes in IMAGENET_COUNTS:
            found[name] = f"a [N, {classes}] output (ImageNet classes)"
        elif named is not None and named.for_classes(classes)[0] is not None:
            found[name] = f"a [N, {classes}] output ({name}) named by metadata '{named.key}'"
        elif name in softmax:
            found[name] = f"a [N, {classes}] output ({name}) computed by a Softmax"
    return found


def choose_postprocess(requested: str | None, metadata: Mapping[str, str], outputs: Mapping[str, object],
                       graph=None) -> tuple[str, str]:
    """The post-processing to apply and why: ``requested`` wins, else the rules in the module docstring
    (``graph``: the model's graph, for outputs computed by a Softmax)."""
    if requested is not None:
        if requested not in POSTPROCESS:
            raise InputError(f"--postprocess must be one of {', '.join(POSTPROCESS)}, got '{requested}'.",
                             "e.g. --postprocess detect for a YOLOv8 detector, topk for a classifier.")
        return requested, "--postprocess"
    if ultralytics_meta(metadata).task == "detect":
        return "detect", "Ultralytics metadata task=detect"
    found = classification_outputs(metadata, outputs, graph)
    if found:
        return "topk", next(iter(found.values()))
    return "none", "no output is a classification (an [N, 1000] output, class names in the metadata, a final Softmax)"


def postprocess(kind: str, origin: str, outputs: Mapping[str, object], metadata: Mapping[str, str], *,
                images: Sequence[tuple[Path, ImageInfo]] = (), k: int = 5, conf: float = DEFAULT_CONF,
                iou: float = DEFAULT_IOU, draw: Path | None = None, graph=None) -> PostResult:
    """Apply ``kind`` to ``outputs``; ``images`` are the image feeds (path, what preprocessing did); ``graph``: the
    model's graph (top-k ranks a classification output first, :func:`classification_outputs`)."""
    if draw is not None and kind != "detect":
        raise InputError(f"--draw needs --postprocess detect (the post-processing is {kind}).",
                         "Add --postprocess detect, or drop --draw.")
    if kind == "none":
        return PostResult(kind, origin)
    if kind == "topk":
        chosen = classification_outputs(metadata, outputs, graph)
        for name, value in sorted(outputs.items(), key=lambda item: item[0] not in chosen):
            rows = classifier_rows(value) if isinstance(value, np.ndarray) else None
            if rows is not None:
                return _ranked(kind, origin, name, value, rows.shape[1], metadata, k)
        raise InputError("--postprocess topk: no output is a classifier output [N, C].",
                         "Use --postprocess none for this model.")
    name, value = next(iter(outputs.items()))
    meta = ultralytics_meta(metadata)
    info = images[0][1] if images else None
    letterbox = info.letterbox if info is not None else None
    result = PostResult(kind, origin, output=name, params={"conf": conf, "iou": iou})
    if info is not None and letterbox is None:
        result.notes.append(f"the image was not letterboxed (preprocess {info.pre.preset}): boxes are in the "
                            "model's input frame, scaled to the original image")
        sx, sy = info.original[0] / info.fed[0], info.original[1] / info.fed[1]
        from onnxaccel.image_geometry import Letterbox  # a plain resize is a letterbox without padding
        letterbox = Letterbox(1 / sx, 0, 0, *info.original) if abs(sx - sy) < 1e-6 else None
    if info is None:
        result.notes.append("no image was given: boxes are in the model's input frame")
    result.detections = decode_yolov8(np.asarray(value), conf=conf, iou=iou, names=meta.names, letterbox=letterbox)
    if draw is not None:
        if not images:
            raise InputError("--draw needs an image input (--input NAME=photo.jpg).", "Give the image with --input.")
        result.drawn = str(draw_detections(images[0][0], result.detections[0], draw))
    return result


def _ranked(kind: str, origin: str, name: str, value: np.ndarray, classes: int, metadata: Mapping[str, str],
            k: int) -> PostResult:
    """Top-k of output ``name``, its classes named by the metadata's names when their count matches."""
    result = PostResult(kind, origin, output=name, params={"k": k})
    labels = None
    named = class_names(metadata)
    if named is not None:
        labels, why = named.for_classes(classes)
        if why is not None:
            imagenet = classes == IMAGENET_CLASSES
            result.notes.append(f"{why}: showing {'ImageNet labels' if imagenet else 'class indices only'}")
        else:
            result.labels = f"metadata '{named.key}'"
    if labels is None and classes == IMAGENET_CLASSES:
        result.labels = "ImageNet"
    result.topk = topk(value, k, labels)
    return result
