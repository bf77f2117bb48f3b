"""Helpers for evaluating a transformed model: point a bound Model at another file, join sample outputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from onnxaccel.model import Model


def model_at(path: Path, like: Model) -> Model:
    """``like`` (bound: same inputs and shapes) pointing at another file, e.g. the optimized model."""
    proto = onnx.load(str(path), load_external_data=False)
    return dataclasses.replace(like, source=str(path), path=Path(path), proto=proto, notes=())


def join(results: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Outputs of several runs joined into one array per name (concatenated along the batch, or flattened
    where shapes differ), so the accuracy gate compares all samples at once."""
    if len(results) == 1:
        return dict(results[0])
    joined = {}
    for name in results[0]:
        parts = [np.asarray(r[name]) for r in results]
        if parts[0].ndim == 0 or any(p.shape[1:] != parts[0].shape[1:] for p in parts):
            joined[name] = np.stack([p.reshape(-1) for p in parts]) if all(
                p.size == parts[0].size for p in parts) else np.concatenate([p.reshape(-1) for p in parts])
        else:
            joined[name] = np.concatenate(parts)
    return joined
