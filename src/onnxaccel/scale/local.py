"""Helpers of the in-process runner; the runner itself is the pipeline (scale/pipeline.py): read/decode, run
and write overlap in three threads."""

from __future__ import annotations

import numpy as np

from onnxaccel.scale.datasets import Unit


def rows_of(unit: Unit) -> np.ndarray:
    """Row indices (within its shard) covered by the unit."""
    return np.arange(unit.start, unit.stop, dtype=np.int64)
