"""`batch` as a library call: plan the job, skip finished shards, run the rest in-process or on Ray, report.

    from onnxaccel.scale import BatchJob, run_batch
    report = run_batch(BatchJob("zoo:resnet50", "images/", "out/", target="cuda/fp16", ray="auto"))

Bad inputs: ``on_error="skip"`` (the default) records each unreadable file as an error row of its shard's record
in the manifest and in ``BatchReport.errors`` and goes on; "stop" stops at the first, naming it. Resume is per
shard (writer.py): a rerun after fixing or removing a bad file recomputes only the shards whose inputs changed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from onnxaccel import startup
from onnxaccel.errors import InputError, ModelError, UsageError
from onnxaccel.inputs import ImagePreprocess, PreprocessRequest
from onnxaccel.prepost.presets import resolve_preprocess
from onnxaccel.model import Model, load_model
from onnxaccel.scale.assemble import ShardAssembler
from onnxaccel.scale.cluster import ray_cluster
from onnxaccel.scale.datasets import ON_ERROR, BadInput, input_kind, open_dataset, plan_units
from onnxaccel.scale.local import rows_of
from onnxaccel.scale.pipeline import run_pipelined
from onnxaccel.scale.ray_data import plan_pool, run_on_ray
from onnxaccel.scale.report import BatchReport, WorkerStats
from onnxaccel.scale.shape_groups import shape_groups
from onnxaccel.scale.stages import merged
from onnxaccel.scale.worker import UnitResult, WorkerSpec, hand_over
from onnxaccel.scale.writer import OutputStore
from onnxaccel.plan import ExecutionPlan, PlanRequest, plan_execution
from onnxaccel.target import Target, parse_target


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
    #: How images become tensors: a concrete ImagePreprocess, a request (``--preprocess`` and overrides) or None,
    #: resolved against the model's metadata as `run` does (prepost/presets.py: Ultralytics task=detect ->
    #: yolo, the zoo's onnxaccel.preprocess, else none with a note).
    preprocess: ImagePreprocess | PreprocessRequest | None = None
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
    #: --shape-buckets text (engines/buckets.py): .npy/.npz shards of different lengths padded to buckets.
    shape_buckets: str | None = None
    #: "skip": an unreadable input becomes an error row and the job goes on; "stop": the job stops at it.
    on_error: str = "skip"
    #: The name reports show for the model (default: ``model``); the CLI runs a cached copy with preprocessing
    #: embedded (transform/embed_preprocess.py embedded_copy) under the name the user gave.
    label: str | None = None
    #: Image decoder of the in-process pipeline for uint8 models: prepost/decode.py DECODERS (auto, hybrid, nvjpeg,
    #: dali, nvimgcodec, torchvision, cpu-pool, cpu).
    decoder: str = "auto"
    #: Embed the image preset in the model's graph: "auto" (on a GPU target reading images with an embeddable
    #: preset), "none", or a preset (plan.py embed_preset decides; transform/embed_preprocess.py embeds).
    embed_preprocess: str | None = "auto"


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
    if job.on_error not in ON_ERROR:
        raise UsageError(f"--on-error {job.on_error!r} is not one of {', '.join(ON_ERROR)}.",
                         "Pass --on-error skip (record bad inputs, go on) or --on-error stop.")
    plan, run_model, model, embedded, notes = plan_job(job)
    if embedded is not None:  # pixels decoded at the embedded preset's geometry, the arithmetic in the graph
        request = PreprocessRequest(preset=embedded["preset"])
    else:
        request = job.preprocess
    image_shape = model.inputs[0].shape if len(model.inputs) == 1 else None
    job = dataclasses.replace(job, preprocess=resolve_preprocess(model.metadata, request, image_shape))
    target = plan.requested
    batch = plan.batch_sizes[0]
    # The rows' own shapes bind the model's dims (under --shape), per group of shards: scale/shape_groups.py.
    dataset = open_dataset(job.input, model, columns=job.columns, id_column=job.id_column,
                           preprocess=job.preprocess, images_per_shard=job.images_per_shard,
                           on_error=job.on_error)
    if job.shape_buckets and dataset.kind != "arrays":
        raise InputError(f"--shape-buckets reads .npy/.npz shards; --input {job.input} holds {dataset.kind}.",
                         "Save rows of each length as .npy/.npz shards (one length per shard), or drop "
                         "--shape-buckets and bind --shape.")
    groups, dataset = shape_groups(model, dataset, dict(job.shapes), batch, job.shape_buckets, job.on_error)
    # What decides how a row is computed, not which files there are (those are fingerprinted per shard), nor
    # where the data lies (the same data moved elsewhere is still the same job).
    described = dataset.describe()
    header = {"model": job.model, "model_key": model.cache_key(), "target": str(target), "batch": batch,
              "shapes": {k: list(v) for k, v in job.shapes.items()},
              "input": {k: described[k] for k in ("kind", "columns", "id_column")}}
    if job.shape_buckets:
        header["shape_buckets"] = job.shape_buckets
    store = OutputStore(job.output, header, overwrite=job.overwrite)
    finished = {s.name for s in dataset.shards if store.is_done(s.name, s.fingerprint, s.rows)}
    store.prune(finished)  # shards gone from the input, or whose inputs changed: their old rows go
    for s in dataset.shards:
        if s.bad is not None and s.name not in finished:
            store.write_bad(s.name, s.index, s.fingerprint, s.bad)
    pending = [s.index for s in dataset.shards if s.rows and s.name not in finished]
    skipped = [s for s in dataset.shards if s.index not in pending and s.bad is None]
    runs = [(group, plan_units(dataset, [i for i in pending if i in group.shards], batch)) for group in groups]
    units = [unit for _, group_units in runs for unit in group_units]
    rows_total = dataset.rows
    rows_skipped = sum(s.rows for s in skipped)
    # The workers build sessions with the plan's target (one CPU thread per GPU session, graph capture as
    # planned); the output header keeps the requested target, so a rerun with the same request resumes.
    specs = [(WorkerSpec(run_model, plan, dataset, dict(group.shapes), shape_buckets=job.shape_buckets,
                         on_error=job.on_error), group_units) for group, group_units in runs if group_units]
    hand_over(run_model, model)  # this process's worker takes the model read here instead of reading it again

    assembler = ShardAssembler(dataset, store)
    stats: dict[str, WorkerStats] = {}
    done = {"rows": 0, "bad": 0, "first": None, "last": None}

    def sink(shard: int, rows: np.ndarray, ids: list[str], outputs: dict, worker: str, read_s: float,
             run_s: float, units_in: int, bad: list[BadInput] | None = None) -> None:
        if done["first"] is None:
            done["first"] = max(0.0, time.perf_counter() - start - read_s - run_s)
            done["first_result"] = startup.now()  # the first rows computed, on the process's clock
        assembler.add(shard, rows, ids, outputs, bad)
        w = stats.setdefault(worker, WorkerStats(worker))
        w.units += units_in
        w.rows += len(rows)
        w.read_s += read_s
        w.run_s += run_s
        done["rows"] += len(rows) - len(bad or ())
        done["bad"] += len(bad or ())
        done["last"] = time.perf_counter() - start  # after the last unit: closing decoders and sessions, checks
        if progress is not None:
            progress(Progress(rows_skipped + done["rows"] + done["bad"], rows_total,
                              len(skipped) + len(assembler.written), len(dataset.shards), worker))

    if progress is not None:
        progress(Progress(rows_skipped, rows_total, len(skipped), len(dataset.shards)))
    warnings: list[str] = list(notes)
    if dataset.kind == "images" and job.preprocess.geometry_warning():
        warnings.append(job.preprocess.geometry_warning())
    if len(groups) > 1:
        warnings.append(f"the rows have {len(groups)} shapes: each ran as a group of its own, with a session bound "
                        "at its shapes" + ("" if job.shape_buckets else "; --shape-buckets pads rows to a few "
                                           "shapes instead (fewer sessions, padded compute)"))
    ray_info = None
    stages = None
    if job.ray is None:
        def unit_sink(result: UnitResult) -> None:
            sink(result.unit.shard, rows_of(result.unit), result.row_ids, result.outputs, result.worker,
                 result.read_s, result.run_s, 1, result.bad)

        parts = []
        for spec, group_units in specs:
            more, times = run_pipelined(spec, group_units, unit_sink)
            warnings += [w for w in more if w not in warnings]
            parts.append(times)
        stages = merged(parts).to_dict() if units else None
    else:
        ray_info = _run_ray(job, specs, target, len(units), sink, warnings)
    assembler.check_complete()
    errors = store.errors()  # this run's and those carried by shards finished before (their input unchanged)
    wall = time.perf_counter() - start
    if specs:  # after the timing: the precision the workers' sessions computed in (CPU conversions only)
        plan = _executed(plan, model, specs[0][0], batch, warnings)
    return BatchReport(
        model=job.label or job.model, target=str(target), runner="in-process" if job.ray is None else "ray",
        input=dataset.describe(), output=str(store.folder), batch=batch, shards_total=len(dataset.shards),
        shards_done=len(assembler.written), shards_skipped=len(skipped), rows_total=rows_total,
        rows_done=done["rows"], rows_skipped=rows_skipped, wall_s=wall,
        startup_s=done["first"] if done["first"] is not None else wall,
        shutdown_s=max(0.0, wall - done["last"]) if done["last"] is not None else 0.0,
        workers=sorted(stats.values(), key=lambda w: w.name), ray=ray_info, warnings=warnings,
        shape_buckets=job.shape_buckets, errors=errors, rows_failed=done["bad"], on_error=job.on_error,
        stages=stages, embedded=embedded, plan=plan.to_dict(),
        startup=startup.Startup(startup.spans(), done.get("first_result")).to_dict(),
        preprocess=job.preprocess.to_dict() if dataset.kind == "images" else None,
        shapes=[entry for group in groups for entry in group.ran],
    )



def _executed(plan: ExecutionPlan, model: Model, spec: WorkerSpec, batch: int, warnings: list[str]) -> ExecutionPlan:
    """The plan with the precision the workers' sessions compute in (pipeline.executed_plan: the model converted
    as they convert it, profiled once per converted file in this process: Ray actors on other hosts are not
    profiled themselves), and a warning where it is not all the precision asked."""
    from onnxaccel.pipeline import BoundModel, ConvertedModel, executed_plan, executed_warning

    if spec.shape_buckets:
        return plan  # a session per bucket: not profiled
    executed = executed_plan(plan, ConvertedModel(BoundModel(model, spec.shapes or None, batch=batch), plan.target))
    warning = executed_warning(executed)
    if warning:
        warnings.append(f"{warning}; profiled in this process, on this host")
    return executed


def plan_job(job: BatchJob) -> tuple[ExecutionPlan, str, Model, dict | None, list[str]]:
    """The job's ExecutionPlan (plan.py), the model it runs (its path and the loaded model, with preprocessing
    embedded where the plan says so: transform/embed_preprocess.py embedded_copy, made once and cached), what that
    model has embedded, and notes.
    The one place `batch` parses its target (text from Python, or the CLI's Target as it is)."""
    target = job.target if isinstance(job.target, Target) else parse_target(job.target)
    model = load_model(job.model)
    preset = job.preprocess.preset if job.preprocess is not None else None
    embed = job.embed_preprocess
    notes: list[str] = []
    if embed == "auto" and _overrides(job.preprocess):
        # An embedded preset computes its own mean/std, resize and channel order: the ones asked run on the host.
        embed = "none"
        notes.append("preprocessing kept on the host: --mean, --std, --resize or --bgr were given, and an embedded "
                     "preset would compute the preset's own")
    request = PlanRequest(command="batch", batch=job.batch, shapes=dict(job.shapes), shape_buckets=job.shape_buckets,
                          preprocess=preset, embed_preprocess=embed, input_kind=input_kind(job.input),
                          decoder=job.decoder)
    plan = plan_execution(target, request, model=model)
    path = job.model
    if plan.embed_preprocess is not None and embedded_of_model(model) is None:
        from onnxaccel.transform.embed_preprocess import embedded_copy

        try:
            embedded_path = embedded_copy(model, plan.embed_preprocess)  # the model read above: read once
        except (UsageError, ModelError) as exc:
            if job.embed_preprocess not in (None, "auto"):
                raise
            notes.append(f"{plan.embed_preprocess} preprocessing kept on the host: {exc.message}")
        else:
            path, model = embedded_path, load_model(embedded_path)
            notes.append(f"{plan.embed_preprocess} preprocessing embedded in the model "
                         f"({plan.choice('embed_preprocess').reason}); embed_preprocess 'none' keeps it on the host")
    return plan, path, model, embedded_of_model(model), notes


def _overrides(pre: ImagePreprocess | PreprocessRequest | None) -> bool:
    """Whether a preprocessing request changes a preset's mean, std, resize or channel order."""
    if not isinstance(pre, PreprocessRequest):
        return False
    return pre.mean is not None or pre.std is not None or pre.resize is not None or pre.channel_order == "bgr"


#: The metadata key a model with embedded preprocessing carries (transform/embed_preprocess.py META_EMBEDDED,
#: read here because scale may not import transform: scripts/check_imports.py).
META_EMBEDDED = "onnxaccel.embedded_preprocess"


def embedded_of_model(model: Model) -> dict | None:
    """What preprocessing the model has embedded (its metadata value: input, preset, scale, mean, std, layout,
    dtype), None if none: such a model is fed uint8 NHWC pixels at the preset's geometry."""
    import json

    value = model.metadata.get(META_EMBEDDED)
    if value is None:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("preset") else None


def _run_ray(job: BatchJob, specs: list, target: Target, count: int, sink, warnings: list[str]) -> dict:
    """Run each shape group's units (``specs``: (WorkerSpec, units) pairs) on one Ray cluster, one after another."""
    with ray_cluster(job.ray, num_cpus=job.local_cpus, object_store_mb=job.local_object_store_mb) as cluster:
        plan = plan_pool(target, cluster.gpus, cluster.cpus, job.workers, job.cpus_per_worker, cluster.address,
                         job.calls_per_worker)
        if target.is_gpu and target.device_id is not None:
            warnings.append(f"Ray gives each actor one GPU (as device 0); the device id in {target} is ignored.")
        for spec, units in specs:
            if target.is_gpu:
                spec = dataclasses.replace(spec, drop_device_id=True)
            elif "intra_op_num_threads" not in target.option_dict:
                # ONNX Runtime's CPU pool defaults to every core; N actors on one node would oversubscribe it.
                spec = dataclasses.replace(spec, options={"intra_op_num_threads": str(max(1, int(plan.num_cpus)))})
            run_on_ray(spec, units, plan, sink, job.units_per_task)
        return {"cluster": cluster.to_dict(), "pool": plan.to_dict(), "units": count}

