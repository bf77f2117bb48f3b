"""The in-process runner: one worker in the CLI's own process, reading the next unit in a thread while the
current one runs (ONNX Runtime and image decoding release the GIL)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from onnxaccel.scale.datasets import Unit
from onnxaccel.scale.worker import BatchWorker, UnitResult, WorkerSpec

Sink = Callable[[UnitResult], None]


def run_in_process(spec: WorkerSpec, units: Sequence[Unit], sink: Sink) -> list[str]:
    """Run every unit in order and hand each result to ``sink``; returns the worker's warnings."""
    if not units:
        return []
    worker = BatchWorker(spec)
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="onnxaccel-read") as pool:
            ahead = pool.submit(worker.read, units[0])
            for i, unit in enumerate(units):
                data = ahead.result()
                if i + 1 < len(units):
                    ahead = pool.submit(worker.read, units[i + 1])
                sink(worker.infer(unit, data))
    finally:
        worker.close()
    return list(worker.warnings)


def rows_of(unit: Unit) -> np.ndarray:
    """Row indices (within its shard) covered by the unit."""
    return np.arange(unit.start, unit.stop, dtype=np.int64)
