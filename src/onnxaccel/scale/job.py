"""`batch` as a library call: plan the job, skip finished shards, run the rest in-process or on Ray, report.

    from onnxaccel.scale import BatchJob, run_batch
    report = run_batch(BatchJob("zoo:resnet50", "images/", "out/", target="cuda/fp16", ray="auto"))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.errors import UsageError
from onnxaccel.inputs import ImagePreprocess
from onnxaccel.model import load_model
from onnxaccel.scale.assemble import ShardAssembler
from onnxaccel.scale.cluster import ray_cluster
from onnxaccel.scale.datasets import open_dataset, plan_units
from onnxaccel.scale.local import run_in_process, rows_of
from onnxaccel.scale.ray_data import plan_pool, run_on_ray
from onnxaccel.scale.report import BatchReport, WorkerStats
from onnxaccel.scale.worker import UnitResult, WorkerSpec
from onnxaccel.scale.writer import OutputStore
from onnxaccel.target import Target, parse_target

DEFAULT_BATCH = {"cpu": 8}
DEFAULT_GPU_BATCH = 32


@dataclass(frozen=True)
class BatchJob:
    """An offline inference job: model, input dataset, output folder, target and how to run it."""
    model: str
    input: str
    output: str
    target: str | Target = "cpu"
    batch: int | None = None
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    columns: Mapping[str, str] = field(default_factory=dict)
    id_column: str | None = None
    preprocess: ImagePreprocess = field(default_factory=ImagePreprocess)
    images_per_shard: int = 1024
    #: None: in-process. "auto", "local" or a cluster address: Ray Data.
    ray: str | None = None
    #: Actors on Ray: default one per GPU of the cluster (GPU target) or one per ``cpus_per_worker`` CPUs.
    workers: int | None = None
    cpus_per_worker: float = 1.0
    #: Units each actor runs at once (threads); None: 2 on GPUs (read overlaps run), 1 on CPUs.
    calls_per_worker: int | None = None
    #: Units per Ray task (dataset block); None: automatic (see ray_data._units_per_task).
    units_per_task: int | None = None
    #: CPUs and object store (MiB) of a local cluster started for this job (None: all CPUs, 1 GiB).
    local_cpus: int | None = None
    local_object_store_mb: int | None = None
    overwrite: bool = False


@dataclass
class Progress:
    """What a progress callback sees after each unit."""

    rows_done: int
    rows_total: int
    shards_done: int
    shards_total: int
    #: The worker ("HOST:PID") whose rows arrived last; None before any.
    worker: str | None = None


def run_batch(job: BatchJob, progress: Callable[[Progress], None] | None = None) -> BatchReport:
    """Run a batch job (in process or on Ray), skipping shards already written from the same input."""
    start = time.perf_counter()
    target = job.target if isinstance(job.target, Target) else parse_target(job.target)
    model = load_model(job.model)
    batch = _batch_size(model, target, job.batch)
    bound = model.bind(dict(job.shapes) or None, batch=batch)
    dataset = open_dataset(job.input, bound, columns=job.columns, id_column=job.id_column,
                           preprocess=job.preprocess, images_per_shard=job.images_per_shard)
    header = {"model": job.model, "model_key": model.cache_key(), "target": str(target), "batch": batch,
              "shapes": {k: list(v) for k, v in job.shapes.items()}, "input": dataset.describe(),
              "input_fingerprint": dataset.fingerprint()}
    header["input"].pop("path", None)  # the same data moved elsewhere is still the same job
    store = OutputStore(job.output, header, overwrite=job.overwrite)
    pending = [s.index for s in dataset.shards if s.rows and not store.is_done(s.name, s.fingerprint, s.rows)]
    skipped = [s for s in dataset.shards if s.index not in pending]
    units = plan_units(dataset, pending, batch)
    rows_total = dataset.rows
    rows_skipped = sum(s.rows for s in skipped)
    spec = WorkerSpec(job.model, str(target), batch, dataset, dict(job.shapes))

    assembler = ShardAssembler(dataset, store)
    stats: dict[str, WorkerStats] = {}
    done = {"rows": 0, "first": None}

    def sink(shard: int, rows: np.ndarray, ids: list[str], outputs: dict, worker: str, read_s: float,
             run_s: float, units_in: int) -> None:
        if done["first"] is None:
            done["first"] = max(0.0, time.perf_counter() - start - read_s - run_s)
        assembler.add(shard, rows, ids, outputs)
        w = stats.setdefault(worker, WorkerStats(worker))
        w.units += units_in
        w.rows += len(rows)
        w.read_s += read_s
        w.run_s += run_s
        done["rows"] += len(rows)
        if progress is not None:
            progress(Progress(rows_skipped + done["rows"], rows_total, len(skipped) + len(assembler.written),
                              len(dataset.shards), worker))

    if progress is not None:
        progress(Progress(rows_skipped, rows_total, len(skipped), len(dataset.shards)))
    warnings: list[str] = []
    ray_info = None
    if job.ray is None:
        def unit_sink(result: UnitResult) -> None:
            sink(result.unit.shard, rows_of(result.unit), result.row_ids, result.outputs, result.worker,
                 result.read_s, result.run_s, 1)

        warnings += run_in_process(spec, units, unit_sink)
    else:
        ray_info = _run_ray(job, spec, target, units, sink, warnings)
    assembler.check_complete()
    wall = time.perf_counter() - start
    return BatchReport(
        model=job.model, target=str(target), runner="in-process" if job.ray is None else "ray",
        input=dataset.describe(), output=str(store.folder), batch=batch, shards_total=len(dataset.shards),
        shards_done=len(assembler.written), shards_skipped=len(skipped), rows_total=rows_total,
        rows_done=done["rows"], rows_skipped=rows_skipped, wall_s=wall,
        startup_s=done["first"] if done["first"] is not None else wall,
        workers=sorted(stats.values(), key=lambda w: w.name), ray=ray_info, warnings=warnings,
    )


def _run_ray(job: BatchJob, spec: WorkerSpec, target: Target, units, sink, warnings: list[str]) -> dict:
    import dataclasses


    with ray_cluster(job.ray, num_cpus=job.local_cpus, object_store_mb=job.local_object_store_mb) as cluster:
        plan = plan_pool(target, cluster.gpus, cluster.cpus, job.workers, job.cpus_per_worker, cluster.address,
                         job.calls_per_worker)
        if target.is_gpu:
            if target.device_id is not None:
                warnings.append(f"Ray gives each actor one GPU (as device 0); the device id in {target} is ignored.")
            spec = dataclasses.replace(spec, drop_device_id=True)
        elif "intra_op_num_threads" not in target.option_dict:
            # ONNX Runtime's CPU pool defaults to every core; N actors on one node would oversubscribe it.
            spec = dataclasses.replace(spec, options={"intra_op_num_threads": str(max(1, int(plan.num_cpus)))})
        if units:
            run_on_ray(spec, units, plan, sink, job.units_per_task)
        return {"cluster": cluster.to_dict(), "pool": plan.to_dict(), "units": len(units)}


def _batch_size(model, target: Target, batch: int | None) -> int:
    spec = model.inputs[0]
    fixed = spec.shape[0] if spec.shape and isinstance(spec.shape[0], int) else None
    if fixed is not None:
        if batch is not None and batch != fixed:
            raise UsageError(f"The model's batch axis is fixed to {fixed}; --batch {batch} cannot apply.",
                             f"Drop --batch (it runs {fixed} row(s) per call), or export the model with a dynamic "
                             "batch axis.")
        return fixed
    if batch is not None:
        if batch < 1:
            raise UsageError(f"--batch must be at least 1, got {batch}.", "e.g. --batch 32")
        return batch
    return DEFAULT_BATCH.get(target.device, DEFAULT_GPU_BATCH)
