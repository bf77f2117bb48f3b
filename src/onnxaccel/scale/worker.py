"""One batch worker: a model compiled for a target, reading units of a dataset and running them.

The same class runs in the CLI's process (in-process runner) and inside each Ray actor (Ray Data runner), so the
two paths compile the same model the same way and compute every unit with the same batch composition.

Bad inputs (``on_error``): with "skip", a unit whose rows cannot be read is still returned, its rows listed in
``UnitResult.bad`` (the driver records them as errors and drops their outputs); an undecodable image is one bad
row fed as zeros, an unreadable .npy/.npz/parquet slice makes every row of the unit bad and runs zeros of the
bound row shape instead (so the Ray runner's blocks keep one schema). With "stop", the read error stops the job
naming the file and saying that a rerun resumes.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.errors import InferenceError, InputError
from onnxaccel.engines.pool import RunnerPool
from onnxaccel.model import Model
from onnxaccel.pipeline import BoundModel, ConvertedModel, ModelFromSource, RunnerFromVariant
from onnxaccel.scale.datasets import BadInput, Dataset, Unit, row_shape_of
from onnxaccel.scale.rows import RowReader
from onnxaccel.plan import INSTANCE_WEIGHTS_LIMIT, ExecutionPlan
from onnxaccel.target import Target

#: The model run_batch read, for the worker and the decoder planning of this process that run the same path, so
#: the file is parsed once (a large model's read is a visible part of start-up); a Ray actor in another process
#: reads its own. Shared: binding makes a copy, and a conversion writes a new model (precision/variant.py).
_handed: dict[str, Model] = {}


def hand_over(path: str, model: Model) -> None:
    """Give ``model`` (read from ``path``) to this process's workers that run ``path`` (:func:`source_of`)."""
    _handed.clear()  # one job at a time: an earlier job's model is not kept alive
    _handed[path] = model


def source_of(path: str) -> str | Model:
    """What a worker reads its model from: the Model handed over for ``path``, else ``path``."""
    return _handed.get(path) or path


#: A GPU job builds its further instances only when the work left outlasts this many times what its first
#: instance took to build and warm (BatchWorker.join_if_worth).
JOIN_WORTH = 2.0


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, picklable: it travels to Ray actors. What runs is the job's ExecutionPlan
    (plan.py), made once by run_batch; the worker reads its target, batch size, instances and graph capture."""

    model: str
    plan: ExecutionPlan
    dataset: Dataset
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: Extra target options for this worker (e.g. intra_op_num_threads for a CPU actor on Ray).
    options: Mapping[str, str] = field(default_factory=dict)
    #: Ray pins one GPU per actor through CUDA/HIP_VISIBLE_DEVICES, so the actor's GPU is device 0.
    drop_device_id: bool = False
    #: --shape-buckets text (engines/buckets.py): rows are padded to the smallest bucket, outputs cropped back.
    shape_buckets: str | None = None
    #: "skip": unreadable rows come back as ``UnitResult.bad``; "stop": they stop the job (InputError).
    on_error: str = "stop"

    @property
    def target(self) -> Target:
        """The plan's target with this worker's extra options, without the device id on a Ray actor."""
        target = self.plan.target.with_options(self.options) if self.options else self.plan.target
        return dataclasses.replace(target, device_id=None) if self.drop_device_id else target

    @property
    def batch(self) -> int:
        """Rows per call (the plan's batch size)."""
        return self.plan.batch_sizes[0]


@dataclass
class UnitResult:
    """Outputs of one unit with its row ids, the worker that ran it and its read and run times. Rows listed in
    ``bad`` (one BadInput per row, ``row`` set) have no meaningful outputs; ``outputs`` is empty when none ran."""
    unit: Unit
    row_ids: list[str]
    outputs: dict[str, np.ndarray]
    read_s: float
    run_s: float
    worker: str
    bad: list[BadInput] = field(default_factory=list)


class BatchWorker:
    """Compiles the model once, then ``read(unit)`` and ``infer(unit, data)`` (or ``run(unit)``) per unit."""

    def __init__(self, spec: WorkerSpec, *, instances: int = 1):
        """``instances``: on GPUs (padded batches), how many sessions run units at once (``infer_async``); the
        pipelined runner passes the plan's count, a Ray actor one per worker."""
        self.spec = spec
        #: What the worker chose and why (the job's report shows them).
        self.notes: list[str] = []
        #: Per instance joining after the start (join_if_worth), its future.
        self.joins: list = []
        target = spec.target
        start = time.perf_counter()
        # No feeds of its own (rows come per unit): bind and convert once, and build the runner in the thread
        # that runs it (engines.pool), as serve's instances are built; CUDA graphs live per thread.
        if spec.shape_buckets:
            self.pool = RunnerPool.build(_bucketed_factory(spec, target), 1, name="batch")
            self.pool.submit(0, self.pool.runners[0].warm_up).result()  # each bucket compiled and warmed at load
            largest = self.pool.runners[0].model  # bound at the largest bucket: bound again at its own shapes
            bound = BoundModel(largest, dict(largest.input_shapes))
        else:
            bound = BoundModel(ModelFromSource(source_of(spec.model)), dict(spec.shapes) or None,
                               batch=spec.batch)
            # On GPUs, a dynamic batch axis runs fixed-size padded batches of ``batch`` rows from reused
            # page-locked buffers, bound once and replayed where the plan captures graphs (engines/pool.py); a
            # short last unit is padded, its extra outputs dropped. Several instances there: one copies its batch
            # in while another runs (the pipeline keeps a unit in flight on each).
            padded = (spec.batch,) if target.is_gpu and _fixed_batch(bound()) is None else ()
            count = max(1, instances) if padded else 1
            if count > 1 and weight_bytes(bound()) > INSTANCE_WEIGHTS_LIMIT:
                count = 1
                self.notes.append(f"one GPU session, not {instances}: the model's weights take "
                                  f"{weight_bytes(bound()) / 2**30:.1f} GiB, and each session holds its own copy")
            # Instances past the plan's instances_at_load are built and warmed while the first one runs units.
            self.pool = RunnerPool.build(RunnerFromVariant(ConvertedModel(bound, target)), count, name="batch",
                                         buckets=padded, graph=bool(padded) and spec.plan.graph_capture,
                                         at_load=spec.plan.instances_at_load)
            if padded:
                self.pool.warm_up()
        self.compile_s = time.perf_counter() - start
        self.runner = self.pool.runners[0]
        self.model = bound()
        self.warnings = list(dict.fromkeys(self.runner.warnings))
        self.fixed_batch = _fixed_batch(self.model)
        self.output_names = [o.name for o in self.model.outputs]
        self.reader = RowReader(spec.dataset, self.model, skip_bad_images=spec.on_error == "skip")
        self.name = f"{os.uname().nodename}:{os.getpid()}"

    def read(self, unit: Unit, out: dict[str, np.ndarray] | None = None
             ) -> tuple[list[str], dict[str, np.ndarray] | None, float, list[BadInput]]:
        """Read a unit's rows and time the read; unreadable rows per ``on_error`` (module docstring). ``out``: per
        input a reused buffer the rows are read into (RowReader.read_rows)."""
        start = time.perf_counter()
        try:
            ids, feeds, bad = self.reader.read_rows(unit, out)
        except InputError as exc:
            shard = self.spec.dataset.shards[unit.shard]
            if self.spec.on_error != "skip":
                raise stopped_at(shard.name, shard.files[0] if len(shard.files) == 1 else None, exc) from None
            ids = [f"{shard.files[0]}:{i}" for i in range(unit.start, unit.stop)]
            bad = [BadInput(shard.files[0], exc.message, "read", row) for row in range(unit.start, unit.stop)]
            feeds = self._zeros(unit.rows)
        return ids, feeds, time.perf_counter() - start, bad

    def _zeros(self, rows: int) -> dict[str, np.ndarray] | None:
        """Feeds of zeros for ``rows`` rows of the bound shapes (None when a row shape is not bound)."""
        feeds = {}
        for spec in self.model.inputs:
            shape = row_shape_of(self.model, spec.name)
            if shape is None or not all(isinstance(d, int) for d in shape):
                return None
            feeds[spec.name] = np.zeros((rows, *shape), np.dtype(spec.dtype))
        return feeds

    @property
    def instances(self) -> int:
        """Units that may run at once now (``infer_async`` on instances 0..instances-1): the instances in service
        (others may still be joining: ``planned_instances``)."""
        return self.pool.in_service

    @property
    def planned_instances(self) -> int:
        """The instances this worker will have once every one joined."""
        return self.pool.planned

    def join_if_worth(self, remaining_s: float) -> str:
        """Build and warm the instances left to join, in the background, when the work left (``remaining_s`` at
        the first instance's rate) outlasts JOIN_WORTH times what the first instance took to build and warm:
        a joining instance's build, first run and capture compete with the running one for the GPU, so a short
        job ends sooner on one instance. What was decided, as a note."""
        warm_s = self.compile_s
        if remaining_s < JOIN_WORTH * warm_s:
            self.pool.joining = None  # nothing will join
            self.pool.planned = self.pool.in_service
            return (f"one instance: the work left (about {remaining_s:.1f} s) ends before another would be warm "
                    f"and worth it (about {warm_s:.1f} s to build and warm, x{JOIN_WORTH:g})")
        self.joins = self.pool.join_in_background()
        return (f"{len(self.joins)} more instance(s) joining: the work left (about {remaining_s:.1f} s) outlasts "
                f"{JOIN_WORTH:g}x their build and warm-up (about {warm_s:.1f} s)")

    def join_note(self) -> str:
        """What joining instances after the start did ('' when every instance was built before it)."""
        pool = self.pool
        stopped = pool.joining.stopped if pool.joining is not None else ""
        if not pool.joined_s and not stopped:
            return ""
        joined = ", ".join(f"instance {i} after {s:.1f} s" for i, s in sorted(pool.joined_s.items()))
        return (f"units started on the first instance; {joined or 'no other instance'} joined while it ran"
                + (f" ({stopped})" if stopped else ""))

    def infer(self, unit: Unit, data: tuple) -> UnitResult:
        """Run the model on rows read by ``read`` (padded to a fixed batch axis) and time the run."""
        return self.infer_async(unit, data, 0).result()

    def infer_async(self, unit: Unit, data: tuple, index: int) -> Future:
        """``infer`` on instance ``index``, in that instance's thread: a Future of the UnitResult."""
        return self.pool.submit(index, self._infer, unit, data, index)

    def _infer(self, unit: Unit, data: tuple, index: int) -> UnitResult:
        ids, feeds, read_s, bad = data
        if feeds is None:  # every row unreadable and no bound shape to run zeros of
            return UnitResult(unit, ids, {}, read_s, 0.0, self.name, bad)
        rows = unit.rows
        if isinstance(feeds, list):  # the unit's rows in parts (a hybrid decoder: host rows, then device rows)
            start = time.perf_counter()
            outputs, _ = self.pool.run_rows(index, feeds)
            return self._result(unit, ids, outputs, read_s, time.perf_counter() - start, bad)
        if self.fixed_batch is not None and rows < self.fixed_batch:
            # A model with a fixed batch axis: pad with copies of the last row and drop their outputs.
            pad = self.fixed_batch - rows
            feeds = {k: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for k, v in feeds.items()}
        start = time.perf_counter()
        if self.pool.buckets:  # padded to the fixed size (and graph replay): outputs of the real rows
            outputs, _ = self.pool.run(index, feeds)
        else:
            outputs = self.pool.runners[index].run(feeds)
        return self._result(unit, ids, outputs, read_s, time.perf_counter() - start, bad)

    def _result(self, unit: Unit, ids: list[str], outputs: dict, read_s: float, run_s: float,
                bad: list[BadInput]) -> UnitResult:
        """The unit's result: each output's rows of the unit (its batch axis checked)."""
        rows = unit.rows
        result = {}
        for name in self.output_names:
            value = outputs[name]
            if value.ndim == 0 or value.shape[0] < rows:
                raise InferenceError(
                    f"Output '{name}' has shape {list(value.shape)}; `batch` needs one output row per input row "
                    f"({rows} here).", "Batch inference needs a model whose outputs have the batch axis first.")
            result[name] = np.ascontiguousarray(value[:rows])
        return UnitResult(unit, ids, result, read_s, run_s, self.name, bad)

    def run(self, unit: Unit) -> UnitResult:
        """Read then infer one unit."""
        return self.infer(unit, self.read(unit))

    def close(self) -> None:
        """Release the worker's runner (its session) and its thread (an instance joining finishes first; none
        starts joining any more)."""
        if self.pool.joining is not None and not self.pool.joining.stopped:
            self.pool.joining.stopped = "the job ended first"
        self.pool.close()


def stopped_at(shard: str, file: str | None, exc: InputError) -> InputError:
    """The error that stops a job on a bad input (``--on-error stop``): which file, why, and that a rerun resumes."""
    where = f"{file} (shard {shard})" if file else f"shard {shard}"
    return InputError(f"The job stopped at {where} (--on-error stop): {exc.message}",
                      "Shards finished before it are kept in --output: fix or remove the file and rerun the same "
                      "command, which resumes with the shards not written yet. Or pass --on-error skip to record "
                      "bad inputs as errors and go on.")


def _bucketed_factory(spec: WorkerSpec, target):
    """Builds a BucketedRunner (in the pool's thread): a session per bucket on targets that compile per shape."""
    from onnxaccel.engines.buckets import BucketedRunner, ShapeBuckets

    buckets = ShapeBuckets.parse(spec.shape_buckets or "")
    model = ModelFromSource(source_of(spec.model))()
    others = {k: v for k, v in spec.shapes.items() if k not in buckets.dims} or None

    def compile(bound):
        return RunnerFromVariant(ConvertedModel(bound, target))()

    return lambda: BucketedRunner(model, target, buckets, compile, batch=spec.batch, shapes=others)


def weight_bytes(model) -> int:
    """Bytes of the model's file and of the external-data files its initializers name."""
    total = model.path.stat().st_size if model.path.is_file() else 0
    files = {entry.value for init in model.proto.graph.initializer for entry in init.external_data
             if entry.key == "location"}
    for name in files:
        path = model.path.parent / name
        total += path.stat().st_size if path.is_file() else 0
    return total


def _fixed_batch(model) -> int | None:
    spec = model.inputs[0]
    if spec.shape and isinstance(spec.shape[0], int):
        return spec.shape[0]
    return None
