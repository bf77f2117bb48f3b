"""Top-k classes with ImageNet labels for 1000-class outputs.

The labels are pytorch/hub's imagenet_classes.txt (vendored verbatim in imagenet_classes.txt next to this
file; its first line names the upstream repository, path and commit). Index i is the i-th label, the order
torchvision's and the ONNX Model Zoo's ImageNet classifiers use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

IMAGENET_CLASSES = 1000


@lru_cache(maxsize=1)
def imagenet_labels() -> tuple[str, ...]:
    """The 1000 ImageNet class names, index = class id."""
    text = resources.files("onnxaccel.prepost").joinpath("imagenet_classes.txt").read_text(encoding="utf-8")
    labels = tuple(line for line in text.splitlines() if line and not line.startswith("#"))
    if len(labels) != IMAGENET_CLASSES:
        raise RuntimeError(f"imagenet_classes.txt holds {len(labels)} labels, not 1000: the package is damaged")
    return labels


@dataclass(frozen=True)
class Ranked:
    """One ranked class: index, raw score, softmax probability and label (None without labels)."""

    index: int
    score: float
    probability: float
    label: str | None

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"index": self.index, "score": self.score, "probability": self.probability, "label": self.label}


def classifier_rows(value: np.ndarray) -> np.ndarray | None:
    """[N, C] scores of a classifier-like output ([N, C] or [N, C, 1, 1]); None for anything else."""
    value = np.asarray(value)
    if value.dtype.kind != "f":
        return None
    if value.ndim > 2 and all(d == 1 for d in value.shape[2:]):
        value = value.reshape(value.shape[:2])
    return value if value.ndim == 2 and value.shape[1] > 1 else None


def topk(value: np.ndarray, k: int, labels: Sequence[str] | None = None) -> list[list[Ranked]]:
    """The ``k`` best classes of each row, named by ``labels`` (one per class, e.g. the model's metadata),
    else ImageNet labels when there are 1000 classes. Probabilities are the softmax of the row unless the row
    already sums to 1 (a model that ends in Softmax)."""
    rows = classifier_rows(value)
    if rows is None:
        return []
    if labels is not None and len(labels) != rows.shape[1]:
        raise ValueError(f"{len(labels)} labels for {rows.shape[1]} classes")
    if labels is None and rows.shape[1] == IMAGENET_CLASSES:
        labels = imagenet_labels()
    out = []
    for row in rows.astype(np.float64):
        probs = row if np.all(row >= 0) and abs(row.sum() - 1) < 1e-3 else _softmax(row)
        idx = np.argsort(-row, kind="stable")[:k]
        out.append([Ranked(int(i), float(row[i]), float(probs[i]), labels[i] if labels else None) for i in idx])
    return out


def _softmax(row: np.ndarray) -> np.ndarray:
    e = np.exp(row - row.max())
    return e / e.sum()
