"""One batch worker: a model compiled for a target, reading units of a dataset and running them.

The same class runs in the CLI's process (in-process runner) and inside each Ray actor (Ray Data runner), so the
two paths compile the same model the same way and compute every unit with the same batch composition.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.errors import InferenceError
from onnxaccel.engines.pool import RunnerPool
from onnxaccel.pipeline import BoundModel, ConvertedModel, ModelFromSource, RunnerFromVariant
from onnxaccel.scale.datasets import Dataset, Unit
from onnxaccel.scale.rows import RowReader
from onnxaccel.target import parse_target


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, picklable: it travels to Ray actors."""

    model: str
    target: str
    batch: int
    dataset: Dataset
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: Extra target options for this worker (e.g. intra_op_num_threads for a CPU actor).
    options: Mapping[str, str] = field(default_factory=dict)
    #: Ray pins one GPU per actor through CUDA/HIP_VISIBLE_DEVICES, so the actor's GPU is device 0.
    drop_device_id: bool = False


@dataclass
class UnitResult:
    """Outputs of one unit with its row ids, the worker that ran it and its read and run times."""
    unit: Unit
    row_ids: list[str]
    outputs: dict[str, np.ndarray]
    read_s: float
    run_s: float
    worker: str


class BatchWorker:
    """Compiles the model once, then ``read(unit)`` and ``infer(unit, data)`` (or ``run(unit)``) per unit."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        target = parse_target(spec.target, options=dict(spec.options))
        if spec.drop_device_id:
            target = dataclasses.replace(target, device_id=None)
        start = time.perf_counter()
        # No feeds of its own (rows come per unit): bind and convert once, and build the runner in the thread
        # that runs it (engines.pool), as serve's instances are built; CUDA graphs live per thread.
        bound = BoundModel(ModelFromSource(spec.model), dict(spec.shapes) or None, batch=spec.batch)
        self.pool = RunnerPool.build(RunnerFromVariant(ConvertedModel(bound, target)), 1, name="batch")
        self.compile_s = time.perf_counter() - start
        self.runner = self.pool.runners[0]
        self.model = bound()
        self.warnings = list(dict.fromkeys(self.runner.warnings))
        self.fixed_batch = _fixed_batch(self.model)
        self.output_names = [o.name for o in self.model.outputs]
        self.reader = RowReader(spec.dataset, self.model)
        self.name = f"{os.uname().nodename}:{os.getpid()}"

    def read(self, unit: Unit) -> tuple[list[str], dict[str, np.ndarray], float]:
        """Read a unit's rows and time the read."""
        start = time.perf_counter()
        ids, feeds = self.reader.read(unit)
        return ids, feeds, time.perf_counter() - start

    def infer(self, unit: Unit, data: tuple[list[str], dict[str, np.ndarray], float]) -> UnitResult:
        """Run the model on rows read by ``read`` (padded to a fixed batch axis) and time the run."""
        ids, feeds, read_s = data
        rows = unit.rows
        if self.fixed_batch is not None and rows < self.fixed_batch:
            # A model with a fixed batch axis: pad with copies of the last row and drop their outputs.
            pad = self.fixed_batch - rows
            feeds = {k: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for k, v in feeds.items()}
        start = time.perf_counter()
        outputs = self.pool.submit(0, self.runner.run, feeds).result()
        run_s = time.perf_counter() - start
        result = {}
        for name in self.output_names:
            value = outputs[name]
            if value.ndim == 0 or value.shape[0] < rows:
                raise InferenceError(
                    f"Output '{name}' has shape {list(value.shape)}; `batch` needs one output row per input row "
                    f"({rows} here).", "Batch inference needs a model whose outputs have the batch axis first.")
            result[name] = np.ascontiguousarray(value[:rows])
        return UnitResult(unit, ids, result, read_s, run_s, self.name)

    def run(self, unit: Unit) -> UnitResult:
        """Read then infer one unit."""
        return self.infer(unit, self.read(unit))

    def close(self) -> None:
        """Release the worker's runner (its session) and its thread."""
        self.pool.close()


def _fixed_batch(model) -> int | None:
    spec = model.inputs[0]
    if spec.shape and isinstance(spec.shape[0], int):
        return spec.shape[0]
    return None
