"""The in-process `batch` runner as a pipeline: read/decode -> run -> write overlap, with bounded queues.

    reader thread ──(queue, ``depth`` units)──> run (this thread, the pool's run thread) ──(queue)──> writer thread
      .npy/parquet: read + cast          fixed-size batches: padded to ``batch``,            ShardAssembler: parquet
      images, uint8 model: decode        on GPUs bound + graph-replayed where the            + manifest, off the
        pool (prepost/decode.py) into    target captures graphs (BatchWorker)                critical path
        shared-memory slots

On GPUs with graph replay, rows are read straight into a ring of page-locked slots (decoded images: the decoders'
shared memory, page-locked too) and copied by DMA into the bound device inputs: no host join, no fresh arrays
(:class:`_PinnedSlots`; ``host_copies`` in the report says which way rows went and why).

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

import queue
import sys
from concurrent.futures import ThreadPoolExecutor
from collections import deque
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.engines.pool import CAPTURE_GATE, pin_for_copies, set_gpu_wait, unpin_for_copies
from onnxaccel.prepost.decode import (GPU_DECODER, LIBRARY_NAMES, DecodePool, choose_decoder, dali_failed,
                                      gpu_decode_threads, pool_size)
from onnxaccel.pipeline import BoundModel, ModelFromSource
from onnxaccel.scale.datasets import BadInput, Unit, row_shape_of
from onnxaccel.scale.worker import GPU_INSTANCES, BatchWorker, UnitResult, WorkerSpec, stopped_at
from onnxaccel.target import parse_target

Sink = Callable[[UnitResult], None]
#: Units read ahead of the run (and shared-memory slots of decoded images).
DEPTH = 4
#: Threads reading .npy/.npz units at once (measured on the H200, issue 22: one thread read ~1.6 GB/s of uint8
#: images through np.load's memory map and was 88% busy at batch 256).
READ_THREADS = 3
#: Units whose results may wait for the writer (their outputs only: ~256 KB a unit for 64 rows of 1,000 floats).
WRITE_AHEAD = 64
#: The GPU decoding process's decoder (``module:Class``; a test names a CPU one).
GPU_DECODER_CLASS = GPU_DECODER
#: On GPU targets, how the run threads wait for the GPU (engines/hostmem.py GPU_WAIT): blocking, so two waiting
#: instances do not spin two cores the decoders, readers and writer need (serve's default too).
GPU_WAIT_MODE = "block"
#: The GIL switch interval while a pipelined job runs (seconds; Python's default is 5 ms): up to seven threads
#: (readers, runs, writer, this one) hand units on, and a thread whose call returned waits for the GIL up to this
#: long while another computes (serve's default too, engines/pool_io.py join_rows).
GIL_SWITCH_S = 0.0005
#: Page-locked bytes the read slots of a GPU job may take (fewer slots past it; at least depth + instances: the
#: reader may hold depth - 2 units started and wait for another while the runs hold instances - 1 and wait for it;
#: depth + instances - 3 slots or fewer hang).
PINNED_SLOTS_BYTES = 1 << 30
#: The ``nvjpeg`` and ``hybrid`` decoders' nvJPEG in the job's own process and CUDA context (decoded batches handed
#: to the model on the device), where the runs take direct copies; else in a process of its own (DecodePool
#: ``gpu``). Measured on the H200 (issue 22, docs/BENCHMARKS.md, 10,000 JPEGs, ResNet-50 FP16, same lease): batch 64
#: 3,979 rows/s against 2,326 in a process of its own, batch 256 5,000-5,214; outputs identical to the process
#: decoder's (top-1 1.0, largest difference 0).
NVJPEG_IN_PROCESS = True
#: Threads decoding with nvJPEG in the job's process, each with its own decoder and CUDA stream; None: the
#: library's own count (prepost/decode.py DECODE_THREADS: nvImageCodec 2, torchvision and DALI 3).
GPU_DECODE_THREADS: int | None = None
#: The decoder chosen and started while the sessions compile (False: before them, one after the other; an A/B).
PLAN_IN_THREAD = True
_END = object()
_PAGE = 4096


def _gpu_decode_threads() -> int:
    """The decoding threads of nvJPEG in the job's process: GPU_DECODE_THREADS, else the library's own count."""
    return GPU_DECODE_THREADS or gpu_decode_threads()


@dataclass
class StageTimes:
    """Seconds per stage of one pipelined run (module docstring), and which decoder decoded images."""

    wall_s: float = 0.0
    read_s: float = 0.0
    #: Threads reading rows at once: ``read`` is their summed seconds, its share over threads x wall.
    read_workers: int = 1
    decode_s: float = 0.0
    decode_workers: int = 0
    wait_for_device_s: float = 0.0
    starved_s: float = 0.0
    run_s: float = 0.0
    #: Units run at once (GPU instances): ``run`` is their summed seconds, its share over instances x wall.
    run_instances: int = 1
    write_s: float = 0.0
    #: How rows reach the GPU: copied by DMA from page-locked read slots (or the decoders' shared memory) straight
    #: into the bound inputs, or joined into the instance's buffer on the host first, and why.
    host_copies: str = ""
    decoder: str | None = None
    decoder_reason: str = ""
    units: int = 0
    #: Units handed to the runner so far (which instance runs the next).
    units_run: int = 0
    notes: list[str] = field(default_factory=list)

    def shares(self) -> dict[str, float]:
        """Each stage's busy share of wall (decode over its processes), 0..1."""
        wall = max(self.wall_s, 1e-9)
        return {"read": self.read_s / (wall * max(1, self.read_workers)), "decode": self.decode_s / (wall * max(1, self.decode_workers)),
                "wait_for_device": self.wait_for_device_s / wall, "starved": self.starved_s / wall,
                "run": self.run_s / (wall * max(1, self.run_instances)), "write": self.write_s / wall}

    def bottleneck(self) -> str:
        """The busiest of read, decode, run and write: the stage that limits the job."""
        shares = self.shares()
        return max(("read", "decode", "run", "write"), key=lambda k: shares[k])

    def to_dict(self) -> dict:
        """JSON-ready: seconds, share of wall (percent), decoder, bottleneck."""
        shares = self.shares()
        stages = {k: {"s": getattr(self, f"{k}_s"), "pct_of_wall": 100 * shares[k]} for k in shares}
        return {"wall_s": self.wall_s, "stages": stages, "decoder": self.decoder, "decoder_reason": self.decoder_reason,
                "decode_workers": self.decode_workers, "read_workers": self.read_workers,
                "run_instances": self.run_instances, "host_copies": self.host_copies,
                "bottleneck": self.bottleneck(), "units": self.units,
                "notes": list(self.notes)}


def run_pipelined(spec: WorkerSpec, units: Sequence[Unit], sink: Sink, *, depth: int | None = None,
                  decoder: str = "auto") -> tuple[list[str], StageTimes]:
    """Run every unit through the pipeline (``depth`` units read ahead; DEPTH by default), handing results to
    ``sink`` in order (from the writer thread); returns the worker's warnings and the stage times."""
    depth = depth or DEPTH
    times = StageTimes()
    if not units:
        return [], times
    # The decoder is chosen and started (spawned processes; nvJPEG's check imports torch and torchvision: seconds)
    # in a thread of its own while the sessions compile and capture their graphs, not before them.
    # The import holds the GIL for seconds and the sessions' warm-up runs take it back after each run: with the
    # short switch interval they wait for it 0.5 ms at a time, not 5 (H200: the sessions took 21 s beside the
    # import at Python's default, 7.3 s alone).
    began = time.perf_counter()
    target = parse_target(spec.target)
    worker = plan = None
    planner = ThreadPoolExecutor(1, thread_name_prefix="onnxaccel-batch-plan")
    planning = planner.submit(_timed, _decode_plan, spec, decoder, times, depth)
    try:
        with _gil_switch(GIL_SWITCH_S if target.is_gpu else None):
            planner.shutdown(wait=not PLAN_IN_THREAD)
            if target.is_gpu:  # before this process first uses the device (the sessions); torch's import does not
                why = set_gpu_wait(target, GPU_WAIT_MODE)
                times.notes.append(f"GPU wait: {GPU_WAIT_MODE}" if not why else f"GPU wait left as is: {why}")
            worker, sessions_s = _timed(BatchWorker, spec, instances=GPU_INSTANCES)
            times.run_instances = worker.instances
            times.notes.extend(worker.notes)
            plan, plan_s = planning.result()
        source, source_s = _timed(_source, worker, spec, plan, depth, times)
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
                       f"choice {plan_s:.1f} s {'at once' if PLAN_IN_THREAD else 'one after the other'}, then "
                       f"{source_s:.1f} s for the readers or decoders")
    try:
        start = time.perf_counter()
        try:
            with _gil_switch(GIL_SWITCH_S if target.is_gpu else None):
                _pump(worker, source, units, sink, depth, times)
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


@dataclass
class _DecodePlan:
    """The decoder chosen for a uint8 image model, its pool (processes starting) and their start-up futures; or,
    for nvJPEG in this process (``inline``: height, width, preset, device), no pool yet."""

    name: str
    pool: DecodePool | None
    starting: list
    inline: tuple | None = None


def _decode_plan(spec: WorkerSpec, decoder: str, times: StageTimes, depth: int = DEPTH) -> _DecodePlan | None:
    """For images fed to a uint8 NHWC model: choose the decoder and start its processes (not waiting for them);
    None for every other input (the worker's own reader: arrays, parquet, float image models)."""
    if spec.dataset.kind != "images" or spec.shape_buckets:
        if spec.dataset.kind == "arrays":
            # .npy/.npz rows are read by several threads at once (file reads release the GIL); parquet handles
            # are not shared between threads.
            times.read_workers = READ_THREADS
        return None
    model = BoundModel(ModelFromSource(spec.model), dict(spec.shapes) or None, batch=spec.batch)()
    model_input = model.inputs[0]
    shape = model.input_shapes.get(model_input.name)
    if not (np.dtype(model_input.dtype) == np.uint8 and shape is not None and len(shape) == 4 and shape[3] == 3):
        # Full-size decode and float preprocessing on the host (the exact `run` path), by several threads at once
        # (Pillow's decoders and resampling, and numpy's arithmetic, release the GIL).
        times.decoder, times.decoder_reason = "host-float", (f"the model takes float tensors: host preprocessing, "
                                                             f"{READ_THREADS} threads")
        times.decode_workers = READ_THREADS
        return None
    target = parse_target(spec.target)
    name, why = choose_decoder(target.device, decoder, guard=CAPTURE_GATE.shared)
    times.decoder, times.decoder_reason = name, why
    height, width = int(shape[1]), int(shape[2])
    pre = spec.dataset.preprocess
    device = 0 if spec.drop_device_id else target.device_id or 0
    if name in ("nvjpeg", "hybrid") and NVJPEG_IN_PROCESS:  # nvJPEG made in _source, once the sessions are up
        workers = max(1, pool_size() - 1) if name == "hybrid" else 0  # hybrid: the CPU pool starts now
        times.decode_workers = _gpu_decode_threads() + workers
        pool = DecodePool(depth + 2, spec.batch, height, width, pre, workers=workers) if workers else None
        return _DecodePlan(name, pool, pool.start() if pool else [], inline=(height, width, pre, device))
    if name in ("nvjpeg", "hybrid"):  # nvJPEG in a process of its own; hybrid adds the CPU pool beside it
        workers = max(1, pool_size() - 1) if name == "hybrid" else 0
        times.decode_workers = workers + 1
        pool = DecodePool(depth + 2, spec.batch, height, width, pre, workers=workers, gpu=device,
                          gpu_decoder=GPU_DECODER_CLASS)
    else:
        workers = pool_size() if name == "cpu-pool" else 0
        times.decode_workers = max(1, workers)
        pool = DecodePool(depth + 2, spec.batch, height, width, pre, workers=workers)
    return _DecodePlan(name, pool, pool.start())


def _decoded_through(times: StageTimes, decoders: list) -> None:
    """Where the GPU decoders made are not the library the choice named (DALI that `auto` chose could not
    start), ``decoder_reason`` says which library decodes and why, so the report names what ran."""
    library = getattr(decoders[0], "library", None) if decoders else None
    name = LIBRARY_NAMES.get(library, library)
    if name and f"through {name}" not in times.decoder_reason:
        why = f"DALI could not start: {dali_failed()}" if dali_failed() else "the library chosen could not start"
        times.decoder_reason += f"; decoded through {name} ({why})"


def _source(worker: BatchWorker, spec: WorkerSpec, plan: _DecodePlan | None, depth: int = DEPTH,
            times: StageTimes | None = None):
    """How rows are read: decoded images into shared memory (``plan``: its processes are waited for here), else
    the worker's own reader (into page-locked slots where the GPU takes direct copies)."""
    times = times if times is not None else StageTimes()
    if plan is None:
        slots, times.host_copies = _PinnedSlots.make(worker, depth)
        return _ReaderSource(worker, READ_THREADS if spec.dataset.kind in ("arrays", "images") else 1, slots)
    if plan.inline is not None:
        why = _direct_copies(worker, every=True)
        if not why and plan.pool is None:
            times.host_copies = ("direct: decoded on the GPU in this process, copied device to device into the "
                                 "bound inputs")
            source = _DeviceDecodeSource(worker, plan.inline)
            _decoded_through(times, source.decoders)
            return source
        if not why:  # hybrid: the CPU pool's rows from page-locked shared memory, nvJPEG's on the device
            for future in plan.starting:
                future.result()
            source = _DeviceHybridSource(worker, plan.pool, plan.inline)
            _decoded_through(times, source.device.decoders)
            host = source.pin()
            times.host_copies = (f"{host}; nvJPEG's rows decoded on the GPU in this process, copied device to "
                                 "device" if host.startswith("direct") else host)
            return source
        # The runs cannot take device rows: nvJPEG in a process of its own after all, into shared memory.
        height, width, pre, device = plan.inline
        if plan.pool is not None:
            plan.pool.close()  # hybrid's CPU pool: a new one with the GPU process beside it
        workers = max(1, pool_size() - 1) if plan.name == "hybrid" else 0
        times.decode_workers = workers + 1
        times.notes.append(f"nvJPEG decodes in a process of its own: the runs copy rows on the host ({why})")
        pool = DecodePool(depth + 2, worker.spec.batch, height, width, pre, workers=workers, gpu=device,
                          gpu_decoder=GPU_DECODER_CLASS)
        try:
            plan = _DecodePlan(plan.name, pool, pool.start())
        except BaseException:
            pool.close()
            raise
    try:
        for future in plan.starting:
            future.result()  # a decoder that cannot start (no CUDA, a broken torchvision) stops the job here
        if plan.name in ("nvjpeg", "hybrid"):
            source = _HybridSource(worker, plan.pool, split=plan.name == "hybrid")
        else:
            source = _PoolSource(worker, plan.pool)
        times.host_copies = source.pin()
    except BaseException:
        plan.pool.close()  # the caller closes the pool it started; this one may be the fallback made here
        raise
    return source


def _direct_copies(worker: BatchWorker, every: bool = False) -> str:
    """'' when the worker's instances copy page-locked rows straight into their bound device inputs (graph
    replay with direct copies: engines/pool.py), else why not. Host rows need one instance that does (the others
    join them on the host); device rows (``every``) need every instance to."""
    pool = worker.pool
    if not pool.target.is_gpu:
        return "joined on the host (CPU target)"
    have = [c is not None for c in pool.copiers]
    if not (pool.graph and (all(have) if every else any(have))):
        return "joined on the host (direct copies need graph capture in the target)"
    return ""


class _PinnedSlots:
    """Reused page-locked host buffers, a padded batch of every input per slot: rows are read straight into a
    slot and copied by DMA into the bound device inputs (RunnerPool's direct copies), with no host join and no
    freshly allocated (page-faulting) arrays per unit."""

    def __init__(self, worker: BatchWorker, count: int, layout: list[tuple[str, tuple[int, ...], np.dtype]],
                 slot_bytes: int):
        self.target = worker.pool.target
        self._base = np.empty(count * slot_bytes + _PAGE, np.uint8)
        offset = (-self._base.ctypes.data) % _PAGE
        self._raw = self._base[offset:offset + count * slot_bytes]
        self.buffers: list[dict[str, np.ndarray]] = []
        for k in range(count):
            at, slot = k * slot_bytes, {}
            for name, shape, dtype in layout:
                nbytes = int(np.prod(shape)) * dtype.itemsize
                slot[name] = self._raw[at:at + nbytes].view(dtype).reshape(shape)
                at += -(-nbytes // 64) * 64
            self.buffers.append(slot)
        self.free: queue.Queue[int] = queue.Queue()
        for k in range(count):
            self.free.put(k)
        self.reason = pin_for_copies(self.target, self._raw.ctypes.data, self._raw.nbytes)

    @classmethod
    def make(cls, worker: BatchWorker, depth: int) -> tuple[_PinnedSlots | None, str]:
        """Slots for ``worker`` reading ``depth`` units ahead (None where the GPU does not take direct copies, an
        input's row shape is not fixed, or pinning is refused) and what the job's copies to the device are."""
        why = _direct_copies(worker)
        if why:
            return None, why
        layout, slot_bytes = [], 0
        for spec in worker.model.inputs:
            rows = row_shape_of(worker.model, spec.name)
            dtype = np.dtype(spec.dtype)
            if rows is None or not all(isinstance(d, int) for d in rows) or dtype == np.dtype(object):
                return None, f"joined on the host (input '{spec.name}' has no fixed row shape)"
            shape = (worker.spec.batch, *rows)
            layout.append((spec.name, shape, dtype))
            slot_bytes += -(-int(np.prod(shape)) * dtype.itemsize // 64) * 64
        slot_bytes = max(_PAGE, -(-slot_bytes // _PAGE) * _PAGE)
        # Up to 2 x depth + instances are in use at once (started, ready, running); never fewer than depth +
        # instances (at depth + instances - 3 or fewer the reader waits for a slot that the runs, waiting for the
        # reader, never give back).
        count = max(depth + worker.instances, min(2 * depth + worker.instances, PINNED_SLOTS_BYTES // slot_bytes))
        slots = cls(worker, count, layout, slot_bytes)
        if slots.reason:
            return None, f"joined on the host (page-locking the read slots failed: {slots.reason})"
        return slots, f"direct: rows read into {count} page-locked slots, copied by DMA into the bound inputs"

    def close(self) -> None:
        """Unpin (once nothing runs on the slots)."""
        if not self.reason:
            unpin_for_copies(self.target, self._raw.ctypes.data)
            self.reason = "closed"


class _ReaderSource:
    """Rows read by the worker, in the reader thread or (``threads`` > 1) by a pool of threads reading the units
    in flight at once: read seconds go to ``read`` (``decode`` for float images). With ``slots``, each unit is
    read into a free page-locked slot, given back once its run is done (``release``); waiting for a free one is
    ``wait_for_device``."""

    def __init__(self, worker: BatchWorker, threads: int = 1, slots: _PinnedSlots | None = None):
        self.worker = worker
        self.slots = slots
        self.threads = ThreadPoolExecutor(threads, thread_name_prefix="onnxaccel-batch-read") if threads > 1 else None

    def start(self, unit: Unit):
        slot, waited = None, 0.0
        if self.slots is not None:
            began = time.perf_counter()
            slot = self.slots.free.get()
            waited = time.perf_counter() - began
        out = self.slots.buffers[slot] if slot is not None else None
        future = self.threads.submit(self.worker.read, unit, out) if self.threads is not None else None
        return unit, future, slot, waited

    def finish(self, pending, times: StageTimes):
        unit, future, slot, waited = pending
        data = future.result() if future is not None else self.worker.read(
            unit, self.slots.buffers[slot] if slot is not None else None)
        times.wait_for_device_s += waited
        if self.worker.spec.dataset.kind == "images":
            times.decode_s += data[2]
        else:
            times.read_s += data[2]
        return unit, data, slot

    def release(self, slot) -> None:
        if slot is not None and self.slots is not None:
            self.slots.free.put(slot)

    def close(self) -> None:
        if self.threads is not None:
            self.threads.shutdown(wait=True, cancel_futures=True)
        if self.slots is not None:
            self.slots.close()


class _PoolSource:
    """Images decoded by a DecodePool into shared-memory slots, several units in flight."""

    def __init__(self, worker: BatchWorker, pool: DecodePool):
        self.worker, self.pool = worker, pool
        self._pinned: np.ndarray | None = None
        self.free: queue.Queue[int] = queue.Queue()
        for slot in range(pool.shape[0]):
            self.free.put(slot)

    def files(self, unit: Unit) -> tuple[list[str], list[str]]:
        """The unit's image files: as the shard names them (row ids, error rows) and as paths to open."""
        return _unit_files(self.worker, unit)

    def start(self, unit: Unit):
        slot = self.free.get()
        rels, paths = self.files(unit)
        return unit, slot, rels, self.pool.submit(slot, paths), time.perf_counter()

    def finish(self, pending, times: StageTimes):
        unit, slot, rels, futures, started = pending
        bad_rows: dict[int, str] = {}
        for future in futures:
            rows, seconds = future.result()
            bad_rows.update(rows)
            times.decode_s += seconds
        bad = _bad_rows(self.worker, unit, rels, bad_rows)
        feeds = {self.worker.model.inputs[0].name: self.pool.view(slot, unit.rows)}
        return unit, (rels, feeds, time.perf_counter() - started, bad), slot

    def pin(self) -> str:
        """Page-lock the decoders' shared memory where the GPU takes direct copies from it: what the job's copies
        to the device are."""
        why = _direct_copies(self.worker)
        if why:
            return why
        self._pinned = self.pool.ring
        reason = pin_for_copies(self.worker.pool.target, self._pinned.ctypes.data, self._pinned.nbytes)
        if reason:
            self._pinned = None
            return f"joined on the host (page-locking the decoders' shared memory failed: {reason})"
        return "direct: decoded into page-locked shared memory, copied by DMA into the bound inputs"

    def release(self, slot) -> None:
        if slot is not None:
            self.free.put(slot)

    def close(self) -> None:
        if self._pinned is not None:
            unpin_for_copies(self.worker.pool.target, self._pinned.ctypes.data)
            self._pinned = None
        self.pool.close()


class _HybridSource(_PoolSource):
    """Images decoded by nvJPEG in a process of its own (DecodePool ``gpu``), alone (``split`` False: the
    ``nvjpeg`` decoder) or together with the CPU decode pool (``hybrid``): each unit's first rows go to the
    pool, the rest to the GPU process, both writing into the unit's shared-memory slot at once, split by the
    rates each side reached so far. Measured on the H200 (issue 22): the pool alone decodes ~3,000-4,100
    images/s on 16 cores, nvJPEG alone 5,800-8,400; inside the job nvJPEG reaches about a third of that. In its own
    process, the GPU time-slices between its CUDA context and ONNX Runtime's, and nvJPEG's short synchronised
    steps wait out the other context's slices (benchmarks/nvjpeg_probe.py: 1/9 of its rate beside a busy GPU;
    docs/BENCHMARKS.md, issue 22 third session). Hybrid was slower than nvJPEG alone (both sides lost rate: they
    share the cores)."""

    def __init__(self, worker: BatchWorker, pool: DecodePool, split: bool = True):
        super().__init__(worker, pool)
        self.split = split
        self.gpu_share = 0.5 if split else 1.0
        self.rates = {"cpu": None, "gpu": None}  # images/s, smoothed
        self.images = {"cpu": 0, "gpu": 0}

    def start(self, unit: Unit):
        slot = self.free.get()
        rels, paths = self.files(unit)
        cut = len(paths) - round(len(paths) * self.gpu_share)
        cpu = self.pool.submit(slot, paths[:cut]) if cut else []
        gpu = self.pool.submit_gpu(slot, cut, paths[cut:]) if cut < len(paths) else None
        return unit, slot, rels, cpu, gpu, cut, time.perf_counter()

    def finish(self, pending, times: StageTimes):
        unit, slot, rels, cpu, gpu, cut, started = pending
        bad_rows: dict[int, str] = {}
        if gpu is not None:
            rows, seconds = gpu.result()
            bad_rows.update(rows)
            times.decode_s += seconds
            self._learn("gpu", len(rels) - cut, seconds)
        self._gather(cpu, cut, bad_rows, times)
        bad = _bad_rows(self.worker, unit, rels, bad_rows)
        feeds = {self.worker.model.inputs[0].name: self.pool.view(slot, unit.rows)}
        return unit, (rels, feeds, time.perf_counter() - started, bad), slot

    def _gather(self, cpu: list, cut: int, bad_rows: dict[int, str], times: StageTimes) -> None:
        """Wait for the CPU pool's part of a unit (its first ``cut`` rows), learn its rate, and move the split
        towards the rates both sides reach."""
        cpu_s = 0.0
        for future in cpu:
            rows, seconds = future.result()
            bad_rows.update(rows)
            times.decode_s += seconds
            cpu_s += seconds
        if cut:
            self._learn("cpu", cut, cpu_s / max(1, min(len(cpu), self.pool.workers)))
        rates = self.rates
        if self.split and rates["cpu"] and rates["gpu"]:
            self.gpu_share = min(0.95, max(0.05, rates["gpu"] / (rates["cpu"] + rates["gpu"])))

    def _learn(self, side: str, images: int, seconds: float) -> None:
        self.images[side] += images
        if seconds <= 0:
            return
        rate = images / seconds
        old = self.rates[side]
        self.rates[side] = rate if old is None else 0.8 * old + 0.2 * rate

    def phase_note(self) -> list[str]:
        """Where the GPU decoding process's time went (its decoder's phases), as a report line."""
        phases = self.pool.gpu_phases()
        images = phases.pop("images", 0)
        if not images:
            return []
        busy = sum(phases.values())
        parts = ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in phases.items())
        return [f"GPU decoding process: {images} images in {busy:.2f} s busy ({images / max(busy, 1e-9):,.0f}/s): "
                f"{parts}"]

    def summary(self) -> str:
        """Who decoded how many images, at what rate."""
        total = max(1, sum(self.images.values()))
        rates = ", ".join(f"{k} {v:,.0f}/s" for k, v in self.rates.items() if v)
        return (f"hybrid decode: nvJPEG {self.images['gpu']} images ({100 * self.images['gpu'] / total:.0f}%), CPU "
                f"pool {self.images['cpu']}; rates {rates}")


class _DeviceDecodeSource:
    """nvJPEG in the job's own process and CUDA context, on GPU_DECODE_THREADS threads (a decoder and stream
    each): a unit's batch stays on the GPU and the run copies it device to device into its bound input
    (RunnerPool's direct copies), with no copy back to the host and none to the device again. In a process of its
    own, nvJPEG took turns with the model's context on the GPU (time-slicing) and kept a third of its rate (issue
    22, benchmarks/nvjpeg_probe.py); here its kernels and the model's share one context. A decode holds the
    capture gate shared (no CUDA call of ours during a graph capture). ``inline``: height, width, preset, device.
    The decoder is GPU_DECODER_CLASS, made with (height, width, preset, device, batch=the job's batch), with
    ``decode_device(paths)``: an array on the device given through ``__cuda_array_interface__``, its work
    finished, and {row: error}."""

    def __init__(self, worker: BatchWorker, inline: tuple, threads: int | None = None):
        import importlib

        threads = threads or _gpu_decode_threads()
        height, width, pre, device = inline
        module, _, cls = GPU_DECODER_CLASS.partition(":")
        make = getattr(importlib.import_module(module), cls)
        self.worker = worker
        try:
            self.decoders = [make(height, width, pre, device, batch=worker.spec.batch)  # here, not later
                             for _ in range(max(1, threads))]
        except Exception as exc:
            from onnxaccel.errors import ProviderUnavailableError

            raise ProviderUnavailableError(
                f"The GPU JPEG decoder (nvJPEG) could not start on device {device}: {type(exc).__name__}: {exc}.",
                "Check the GPU with `onnxaccel doctor`, or pass --decoder cpu-pool.") from exc
        self._free: queue.Queue = queue.Queue()
        for decoder in self.decoders:
            self._free.put(decoder)
        self.threads = ThreadPoolExecutor(len(self.decoders), thread_name_prefix="onnxaccel-batch-nvjpeg")

    def _decode(self, paths: list[str]):
        decoder = self._free.get()
        try:
            start = time.perf_counter()
            with CAPTURE_GATE.shared():
                pixels, bad = decoder.decode_device(paths)
            return pixels, bad, time.perf_counter() - start
        finally:
            self._free.put(decoder)

    def start(self, unit: Unit):
        rels, paths = _unit_files(self.worker, unit)
        return unit, rels, self.threads.submit(self._decode, paths), time.perf_counter()

    def finish(self, pending, times: StageTimes):
        unit, rels, future, started = pending
        pixels, bad_rows, seconds = future.result()
        times.decode_s += seconds
        bad = _bad_rows(self.worker, unit, rels, bad_rows)
        feeds = {self.worker.model.inputs[0].name: pixels}
        # The batch is the "slot": held (with its device memory) until its run is done, then dropped.
        return unit, (rels, feeds, time.perf_counter() - started, bad), pixels

    def release(self, slot) -> None:
        pass

    def phase_note(self) -> list[str]:
        """Where the decoding threads' time went (their decoders' phases summed), as a report line."""
        phases: dict[str, float] = {}
        for decoder in self.decoders:
            for key, value in getattr(decoder, "phases", {}).items():
                phases[key] = phases.get(key, 0) + value
        images = phases.pop("images", 0)
        if not images:
            return []
        busy = sum(phases.values())
        parts = ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in phases.items() if v)
        library = getattr(self.decoders[0], "library", None)
        via = f" through {LIBRARY_NAMES.get(library, library)}" if library else ""
        fallback = sum(getattr(decoder, "fallback_images", 0) for decoder in self.decoders)
        used = next((d._fallback.library for d in self.decoders if getattr(d, "_fallback", None) is not None), None)
        other = (f"; {fallback} of them through {LIBRARY_NAMES.get(used, used)} (not JPEG, or in a batch "
                 f"{LIBRARY_NAMES.get(library, library)} could not decode)") if fallback else ""
        return [f"nvJPEG{via} in this process ({len(self.decoders)} threads): {images} images in {busy:.2f} s busy "
                f"({images / max(busy, 1e-9):,.0f}/s per thread-second): {parts}{other}"]

    def close(self) -> None:
        self.threads.shutdown(wait=True, cancel_futures=True)


class _DeviceHybridSource(_HybridSource):
    """``hybrid`` with nvJPEG in the job's own process: each unit's first rows are decoded by the CPU pool into
    the unit's slot of (page-locked) shared memory, the rest by nvJPEG on the GPU (_DeviceDecodeSource's threads),
    split by the rates each side reached; the run copies the host rows (host to device) and the device rows
    (device to device) each into its rows of the bound input, no host join (engines/pool.py _run_direct)."""

    def __init__(self, worker: BatchWorker, pool: DecodePool, inline: tuple):
        super().__init__(worker, pool, split=True)
        self.device = _DeviceDecodeSource(worker, inline)

    def start(self, unit: Unit):
        slot = self.free.get()
        rels, paths = self.files(unit)
        cut = len(paths) - round(len(paths) * self.gpu_share)
        cpu = self.pool.submit(slot, paths[:cut]) if cut else []
        gpu = self.device.threads.submit(self.device._decode, paths[cut:]) if cut < len(paths) else None
        return unit, slot, rels, cpu, gpu, cut, time.perf_counter()

    def finish(self, pending, times: StageTimes):
        unit, slot, rels, cpu, gpu, cut, started = pending
        bad_rows: dict[int, str] = {}
        name = self.worker.model.inputs[0].name
        parts = []
        pixels = None
        if gpu is not None:
            pixels, rows, seconds = gpu.result()
            bad_rows.update({cut + i: message for i, message in rows.items()})
            times.decode_s += seconds
            self._learn("gpu", len(rels) - cut, seconds)
        self._gather(cpu, cut, bad_rows, times)
        if cut:
            parts.append({name: self.pool.view(slot, cut)})
        if pixels is not None:
            parts.append({name: pixels})
        bad = _bad_rows(self.worker, unit, rels, bad_rows)
        feeds = parts if len(parts) > 1 else parts[0]
        # The slot, and the device batch (its memory held until the run is done).
        return unit, (rels, feeds, time.perf_counter() - started, bad), (slot, pixels)

    def release(self, slot) -> None:
        if slot is not None:
            super().release(slot[0])

    def phase_note(self) -> list[str]:
        return self.device.phase_note()

    def close(self) -> None:
        self.device.close()
        super().close()


def _unit_files(worker: BatchWorker, unit: Unit) -> tuple[list[str], list[str]]:
    """A unit's image files: as the shard names them (row ids, error rows) and as paths to open."""
    rels = list(worker.spec.dataset.shards[unit.shard].files[unit.start:unit.stop])
    return rels, [str(worker.reader._path(r)) for r in rels]


def _bad_rows(worker: BatchWorker, unit: Unit, rels: list[str], bad_rows: dict[int, str]) -> list[BadInput]:
    """Undecodable images of a unit (row = index within the unit) as BadInputs, or the job stopped at the first
    one (``--on-error stop``)."""
    if not bad_rows:
        return []
    if worker.spec.on_error != "skip":
        from onnxaccel.errors import InputError

        first = min(bad_rows)
        shard = worker.spec.dataset.shards[unit.shard]
        raise stopped_at(shard.name, rels[first], InputError(bad_rows[first], ""))
    return [BadInput(rels[i], bad_rows[i], "read", unit.start + i) for i in sorted(bad_rows)]


def _pump(worker: BatchWorker, source, units: Sequence[Unit], sink: Sink, depth: int, times: StageTimes) -> None:
    """The three stages: a reader thread, the run in this thread, a writer thread."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    # Results wait here for the writer: a shard's parquet write and fsync take 100+ ms at once, and a queue as
    # short as ``ready`` made every run wait out each one (the H200's npy run: write 82% busy, run stalled).
    written: queue.Queue = queue.Queue(maxsize=max(depth, WRITE_AHEAD))
    stop = threading.Event()
    failure: list[BaseException] = []

    def read() -> None:
        try:
            inflight: list = []
            for unit in units:
                if stop.is_set():
                    return
                inflight.append(source.start(unit))
                if len(inflight) < max(1, depth - 1):
                    continue
                _put(ready, source.finish(inflight.pop(0), times), stop, times)
            for pending in inflight:
                _put(ready, source.finish(pending, times), stop, times)
        except BaseException as exc:  # handed to the run loop, which raises it after the units before it
            _put(ready, exc, stop, times)
            return
        _put(ready, _END, stop, times)

    def write() -> None:
        while True:
            result = written.get()
            if result is _END:
                return
            if failure:
                continue  # drain: a write failed already
            start = time.perf_counter()
            try:
                sink(result)
            except BaseException as exc:
                failure.append(exc)
                stop.set()
            times.write_s += time.perf_counter() - start

    reader = threading.Thread(target=read, name="onnxaccel-batch-read", daemon=True)
    writer = threading.Thread(target=write, name="onnxaccel-batch-write", daemon=True)
    reader.start()
    writer.start()
    inflight: deque = deque()  # (future, slot), oldest first: results are written in unit order

    def finish_oldest() -> None:
        future, slot = inflight.popleft()
        try:
            result = future.result()
        finally:
            source.release(slot)
        times.run_s += result.run_s
        written.put(result)

    try:
        while not failure:
            waited = time.perf_counter()
            item = ready.get()
            times.starved_s += time.perf_counter() - waited
            if item is _END:
                break
            if isinstance(item, BaseException):
                raise item
            unit, data, slot = item
            # One unit in flight per instance (instance k % n): a GPU copies one in while another runs.
            inflight.append((worker.infer_async(unit, data, times.units_run % worker.instances), slot))
            times.units_run += 1
            if len(inflight) >= worker.instances:
                finish_oldest()
        while inflight and not failure:
            finish_oldest()
    finally:
        stop.set()
        for future, slot in inflight:  # after a failure: let runs finish before their slots are reused
            future.exception()
            source.release(slot)
        inflight.clear()
        _drain(ready, source)
        written.put(_END)
        writer.join()
        reader.join(timeout=60)
    if failure:
        raise failure[0]


def _put(q: queue.Queue, item, stop: threading.Event, times: StageTimes) -> None:
    """Put ``item``, timing the wait as ``wait_for_device`` (the runner is busy); gives up once stopped."""
    start = time.perf_counter()
    while True:
        try:
            q.put(item, timeout=0.1)
            break
        except queue.Full:
            if stop.is_set():
                return
    times.wait_for_device_s += time.perf_counter() - start


def _drain(q: queue.Queue, source) -> None:
    """Empty ``ready`` after a stop, giving decoded slots back (so the reader can finish its put)."""
    while True:
        try:
            item = q.get_nowait()
        except queue.Empty:
            return
        if isinstance(item, tuple):
            source.release(item[2])
