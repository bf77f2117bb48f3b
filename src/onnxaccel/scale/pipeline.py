"""The in-process `batch` runner as a pipeline: read/decode -> run -> write overlap, with bounded queues.

    reader thread ──(queue, ``depth`` units)──> run (this thread, the pool's run thread) ──(queue)──> writer thread
      .npy/parquet: read + cast          fixed-size batches: padded to ``batch``,            ShardAssembler: parquet
      images, uint8 model: decode        on GPUs bound + graph-replayed where the            + manifest, off the
        pool (prepost/decode_pool) into  target captures graphs (BatchWorker)                critical path
        shared-memory slots

On GPUs with graph replay, rows are read straight into a ring of page-locked slots (decoded images: the decoders'
shared memory, page-locked too) and copied by DMA into the bound device inputs: no host join, no fresh arrays
(host_sources.py :class:`_PinnedSlots`; ``host_copies`` in the report says which way rows went and why).

The parts: this module runs the job (start-up, the GIL switch, the GPU wait); stages.py holds the three stages and
their times; host_sources.py reads rows on the host (reader, page-locked slots, the CPU decode pool);
decode_sources.py chooses the image decoder and holds the nvJPEG sources.

Every stage is timed, so the report says which one limits the job (:class:`StageTimes`): ``read`` (reading and
casting rows), ``decode`` (decoding images: seconds of all decoding processes, its share of wall is over
processes x wall), ``wait_for_device`` (the reader blocked because the runner is busy: the model is the limit),
``starved`` (the runner waited for rows: input is the limit), ``run`` (H2D + model + D2H; on GPUs two instances
each hold a unit, so one copies while the other runs, and its share is over instances x wall), ``write`` (parquet
and manifest).

Exactly-once and resume are unchanged: units are produced, run and handed to the sink in order by one thread each,
a failure stops the reader, the units already run are still written (their shards finish as before), and the
ShardAssembler refuses a row twice. Killed (SIGKILL), the job leaves only whole shards behind (writer.py).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from onnxaccel import startup
from onnxaccel.engines.pool import set_gpu_wait
from onnxaccel.scale.datasets import Unit
from onnxaccel.scale.decode_sources import _decode_plan, _DeviceDecodeSource, _HybridSource, _source
from onnxaccel.scale.stages import DEPTH, Sink, StageTimes, _pump
from onnxaccel.scale.worker import BatchWorker, WorkerSpec


def run_pipelined(spec: WorkerSpec, units: Sequence[Unit], sink: Sink, *, depth: int | None = None
                  ) -> tuple[list[str], StageTimes]:
    """Run every unit through the pipeline (``depth`` units read ahead; DEPTH by default), handing results to
    ``sink`` in order (from the writer thread); returns the worker's warnings and the stage times. The job's
    ExecutionPlan (``spec.plan``) says how the run threads wait for the GPU, the GIL switch interval while up to
    seven threads (readers, runs, writer, this one) hand units on, the instances and the image decoder."""
    depth = depth or DEPTH
    times = StageTimes()
    if not units:
        return [], times
    # The decoder is chosen and started (spawned processes; nvJPEG's check imports torch and torchvision: seconds)
    # in a thread of its own while the sessions compile and capture their graphs, not before them.
    # The import holds the GIL for seconds and the sessions' warm-up runs take it back after each run: with the
    # short switch interval they wait for it 0.5 ms at a time, not 5 (at Python's default the sessions took far
    # longer beside the import than alone: see docs/BENCHMARKS.md).
    began, began_at = time.perf_counter(), startup.now()
    target, execution = spec.target, spec.plan
    decoder = execution.decoder or "auto"
    worker = plan = None
    planner = ThreadPoolExecutor(1, thread_name_prefix="onnxaccel-batch-plan")
    planning = planner.submit(_timed, _decode_plan, spec, decoder, times, depth)
    try:
        with _gil_switch(execution.gil_switch_s):
            planner.shutdown(wait=False)
            if execution.gpu_wait:  # before this process first uses the device (the sessions)
                why = set_gpu_wait(target, execution.gpu_wait)
                times.notes.append(f"GPU wait: {execution.gpu_wait}" if not why else f"GPU wait left as is: {why}")
            worker, sessions_s = _timed(BatchWorker, spec, instances=execution.instances)
            times.run_instances = worker.planned_instances
            times.notes.extend(worker.notes)
            plan, plan_s = planning.result()
        decoding = f"decoder {plan.name}" if plan is not None else "no decoder"
        startup.record("workers", plan_s, start=began_at, detail=f"{decoding}: chosen, processes started")
        source, source_s = _timed(_source, worker, spec, plan, depth, times)
        startup.record("decoder warm-up", source_s, detail=f"{decoding}: readers up")
    except BaseException:
        if plan is None and planning.done():
            plan = None if planning.exception() else planning.result()[0]
        elif plan is None:  # the planning thread may still start decoders: close them once it has
            planning.add_done_callback(_close_planned)
        if plan is not None and plan.pool is not None:
            plan.pool.close()
        if worker is not None:
            worker.close()
        raise
    times.notes.append(f"start-up {time.perf_counter() - began:.1f} s: sessions {sessions_s:.1f} s and decoder "
                       f"choice {plan_s:.1f} s at once, then "
                       f"{source_s:.1f} s for the readers or decoders")
    try:
        start = time.perf_counter()
        try:
            with _gil_switch(execution.gil_switch_s):
                _pump(worker, source, units, sink, depth, times)
            if note := worker.join_note():
                times.notes.append(note)
            times.run_instances = worker.planned_instances  # fewer where the job ended too soon for more
            if isinstance(source, _HybridSource) and source.split:
                times.notes.append(source.summary())
            if isinstance(source, (_HybridSource, _DeviceDecodeSource)):  # _DeviceHybridSource is a _HybridSource
                times.notes.extend(source.phase_note())
        finally:
            source.close()
            times.wall_s = time.perf_counter() - start
    finally:
        worker.close()
    times.units = len(units)
    return list(worker.warnings), times


def _close_planned(planning) -> None:
    """Close the decoders a planning future started (after the job failed without waiting for it)."""
    if not planning.cancelled() and planning.exception() is None:
        plan = planning.result()[0]
        if plan is not None and plan.pool is not None:
            plan.pool.close()


def _timed(fn, *args, **kwargs):
    """``fn``'s result and the seconds it took."""
    start = time.perf_counter()
    return fn(*args, **kwargs), time.perf_counter() - start


_switch_lock = threading.Lock()
_switch_users = [0, 0.0]  # pipelined runs inside _gil_switch now, Python's interval before the first


@contextmanager
def _gil_switch(seconds: float | None):
    """Python's GIL switch interval at ``seconds`` while the block runs (None: left as is). The interval is the
    process's: runs on several threads at once share one setting, and the last to leave puts back the interval
    from before the first."""
    if seconds is None:
        yield
        return
    with _switch_lock:
        if not _switch_users[0]:
            _switch_users[1] = sys.getswitchinterval()
        _switch_users[0] += 1
        sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users[0] -= 1
            if not _switch_users[0]:
                sys.setswitchinterval(_switch_users[1])
