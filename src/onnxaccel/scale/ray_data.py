"""The Ray Data runner: units as a dataset, ``map_batches`` over a fixed pool of actors (one per GPU with
``num_gpus=1``; on a CPU target, one per ``cpus_per_worker`` CPUs), results streamed back to the driver, which
assembles and writes the shards.

Each dataset row is one unit (shard, start, stop); ``batch_size=1`` hands an actor one unit per call, and the actor
reads that unit's rows itself, so a row's batch composition is the same as in-process. Units are grouped into
dataset blocks, one Ray task each (up to 16 units): Ray Data's cost is per task (~15 ms on the 2-core development
machine, docs/SCALE.md), so one unit per task would cost more than a GPU batch. Inputs are therefore read
on the worker nodes: on a multi-node cluster the input folder must be at the same path on every node (a shared
filesystem). Outputs travel back through the object store to the driver, which writes them.

Failure handling is Ray Data's: an actor pool's actors restart (``max_restarts=-1``) and a task whose actor died
is retried on another (``max_task_retries=-1``) (ray/data/_internal/execution/operators/
actor_pool_map_operator.py, Ray 2.60.0). A retried unit's first attempt returned nothing, so each row still
arrives once; ``ShardAssembler`` checks it.

Bad inputs (``--on-error skip``) travel as a ``__bad`` column: a JSON BadInput on each unreadable row, empty
elsewhere; the row's outputs are those of the zeros the worker ran in its place (worker.py), so every block keeps
one schema, and the driver drops them. A unit with no bound row shape to run zeros of (``--shape-buckets``) cannot
be carried that way, so on Ray it stops the job naming the file.

API per Ray version: ``compute=ActorPoolStrategy(size=N)``; the ``concurrency=`` argument of ``map_batches`` is
deprecated in Ray 2.60 ("concurrency: This argument is deprecated. Use ``compute`` argument.").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from onnxaccel import errors
from onnxaccel.errors import OnnxAccelError, UsageError
from onnxaccel.scale.datasets import BadInput, Unit
from onnxaccel.scale.worker import BatchWorker, UnitResult, WorkerSpec

META = ("__shard", "__row", "__row_id", "__worker", "__read_s", "__run_s", "__bad")
#: Dataset blocks (Ray tasks) at most; beyond, blocks hold more units each.
MAX_BLOCKS = 20000
MAX_UNITS_PER_TASK = 16


@dataclass(frozen=True)
class PoolPlan:
    """How many actors and what each reserves."""

    workers: int
    num_gpus: float
    num_cpus: float
    #: Units one actor runs at once in threads: 2 on a GPU overlaps reading the next unit with running this one.
    calls: int = 1

    def to_dict(self) -> dict:
        """JSON-ready form of the worker pool plan."""
        return {"workers": self.workers, "num_gpus_per_worker": self.num_gpus, "num_cpus_per_worker": self.num_cpus,
                "calls_per_worker": self.calls}


def plan_pool(target, cluster_gpus: float, cluster_cpus: float, workers: int | None, cpus_per_worker: float,
              where: str = "the cluster", calls: int | None = None) -> PoolPlan:
    """GPU target: one actor per GPU (``num_gpus=1``), all the cluster's GPUs unless ``workers`` says fewer. CPU
    target: one actor per ``cpus_per_worker`` CPUs."""
    if target.is_gpu:
        if cluster_gpus < 1:
            raise UsageError(f"The target {target} needs GPUs, and the Ray cluster at {where} has none.",
                             "Start the cluster's nodes on GPU machines (Ray detects NVIDIA and AMD GPUs as 'GPU'), "
                             "or use --target cpu.")
        count = workers or int(cluster_gpus)
        if count > cluster_gpus:
            raise UsageError(f"{count} workers need {count} GPUs; the cluster has {cluster_gpus:g}.",
                             f"Pass --workers {int(cluster_gpus)} or fewer.")
        return PoolPlan(count, 1.0, 1.0, calls or 2)
    cpus = max(cpus_per_worker, 1.0)
    return PoolPlan(workers or max(1, int(cluster_cpus // cpus)), 0.0, cpus, calls or 1)


class WorkerFailure(Exception):
    """An OnnxAccelError raised inside an actor, in a form that survives pickling (its args are plain text)."""

    def __init__(self, kind: str, message: str, hint: str | None):
        super().__init__(kind, message, hint)


class InferenceActor:
    """The callable class Ray Data runs in each actor: compile once, then one unit per call."""

    def __init__(self, spec: WorkerSpec):
        try:
            self.worker = BatchWorker(spec)
        except OnnxAccelError as exc:
            raise WorkerFailure(type(exc).__name__, exc.message, exc.hint) from None

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = []
        try:
            for shard, start, stop in zip(batch["shard"], batch["start"], batch["stop"], strict=True):
                result = self.worker.run(Unit(int(shard), int(start), int(stop)))
                if not result.outputs:
                    bad = result.bad[0]
                    raise WorkerFailure("InputError", f"Cannot read {bad.file}: {bad.reason}",
                                        "On Ray a bad input is carried only when the model's row shapes are bound "
                                        "(not with --shape-buckets): fix or remove the file and rerun (finished "
                                        "shards are kept), or run without --ray.")
                results.append(result)
        except OnnxAccelError as exc:
            raise WorkerFailure(type(exc).__name__, exc.message, exc.hint) from None
        return to_columns(results)


def to_columns(results: Sequence[UnitResult]) -> dict[str, np.ndarray]:
    """One row per input row: where it belongs, its id, who computed it, and its outputs."""
    sizes = [r.unit.rows for r in results]
    first = np.zeros(sum(sizes), bool)
    first[np.cumsum([0, *sizes[:-1]])] = True
    columns = {
        "__shard": np.concatenate([np.full(n, r.unit.shard, np.int64) for r, n in zip(results, sizes, strict=True)]),
        "__row": np.concatenate([np.arange(r.unit.start, r.unit.stop, dtype=np.int64) for r in results]),
        "__row_id": np.array([i for r in results for i in r.row_ids], dtype=object),
        "__worker": np.array([r.worker for r, n in zip(results, sizes, strict=True) for _ in range(n)], dtype=object),
        # Per-unit timings on the unit's first row, zero elsewhere, so sums stay right.
        "__read_s": np.where(first, np.repeat([r.read_s for r in results], sizes), 0.0),
        "__run_s": np.where(first, np.repeat([r.run_s for r in results], sizes), 0.0),
        "__bad": np.array([_bad_text(r, row) for r in results for row in range(r.unit.start, r.unit.stop)],
                          dtype=object),
    }
    for name in results[0].outputs:
        columns[name] = np.concatenate([r.outputs[name] for r in results])
    return columns


def _bad_text(result: UnitResult, row: int) -> str:
    for item in result.bad:
        if item.row == row:
            return json.dumps(item.to_dict())
    return ""


RowsSink = Callable[..., None]


def run_on_ray(spec: WorkerSpec, units: Sequence[Unit], plan: PoolPlan, sink: RowsSink,
               units_per_task: int | None = None) -> None:
    """Run the units on an actor pool of the connected cluster; ``sink(shard, rows, ids, outputs, worker, read_s,
    run_s, units, bad)`` per shard per block as blocks come back."""
    import ray
    import ray.data
    from ray.data import ActorPoolStrategy

    if not units:
        return
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # the plan, progress and "bars disabled" lines
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.execution_options.preserve_order = False
    items = [{"shard": u.shard, "start": u.start, "stop": u.stop} for u in units]
    per_task = units_per_task or _units_per_task(len(items), plan.workers * plan.calls)
    dataset = ray.data.from_items(items, override_num_blocks=max(1, min(-(-len(items) // per_task), MAX_BLOCKS)))
    mapped = dataset.map_batches(
        InferenceActor, fn_constructor_kwargs={"spec": spec}, batch_size=1, batch_format="numpy",
        compute=_strategy(ActorPoolStrategy, plan), num_gpus=plan.num_gpus or None, num_cpus=plan.num_cpus,
        udf_modifying_row_count=True,
    )
    try:
        for block in mapped.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=2):
            _deliver(block, sink)
    except Exception as exc:  # noqa: BLE001 - Ray wraps the worker's error; find ours inside
        failure = _find_failure(exc)
        if failure is not None:
            raise failure from None
        raise


def _units_per_task(units: int, slots: int) -> int:
    """Units per Ray task (dataset block): Ray Data's cost is per task, so several units share one, while every
    actor slot still gets at least 8 tasks to balance load and a retry after a crash redoes little."""
    return max(1, min(MAX_UNITS_PER_TASK, units // (8 * max(1, slots))))


def _strategy(strategy, plan: PoolPlan):
    if plan.calls <= 1:
        return strategy(size=plan.workers)
    # Threads in the actor: ONNX Runtime and numpy release the GIL, so one call reads while another runs.
    return strategy(size=plan.workers, max_concurrent_calls_per_actor=plan.calls, enable_true_multi_threading=True,
                    max_tasks_in_flight_per_actor=2 * plan.calls)


def _deliver(block: dict[str, np.ndarray], sink: RowsSink) -> None:
    shards = block["__shard"]
    outputs = {k: v for k, v in block.items() if k not in META}
    for shard in np.unique(shards):
        mask = shards == shard
        workers = block["__worker"][mask]
        for worker in np.unique(workers):
            sel = mask.copy()
            sel[mask] = workers == worker
            first_rows = int(np.count_nonzero(block["__read_s"][sel] + block["__run_s"][sel] > 0))
            bad = [BadInput(**json.loads(str(v))) for v in block["__bad"][sel] if v] if "__bad" in block else []
            sink(int(shard), block["__row"][sel], [str(v) for v in block["__row_id"][sel]],
                 {k: v[sel] for k, v in outputs.items()}, str(worker), float(block["__read_s"][sel].sum()),
                 float(block["__run_s"][sel].sum()), max(1, first_rows), bad)


def _find_failure(exc: BaseException) -> OnnxAccelError | None:
    """The OnnxAccelError an actor raised, rebuilt from the WorkerFailure somewhere in Ray's wrapping."""
    seen = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, WorkerFailure):
            kind, message, hint = current.args
            cls = getattr(errors, kind, None)
            if isinstance(cls, type) and issubclass(cls, OnnxAccelError) and cls is not errors.MissingDependencyError:
                return cls(message, hint)
            return OnnxAccelError(message, hint)
        stack.extend([current.__cause__, current.__context__, getattr(current, "cause", None)])
        for arg in getattr(current, "args", ()):
            if isinstance(arg, BaseException):
                stack.append(arg)
    text = str(exc)
    if "WorkerFailure" in text:
        return OnnxAccelError(f"A Ray worker failed: {text.strip().splitlines()[-1]}",
                              "Rerun with --debug for Ray's full traceback.")
    return None


