"""The three stages of a pipelined `batch` run (scale/pipeline.py) and their times: a reader thread hands units
to the run (the caller's thread) through a bounded queue, and a writer thread hands results to the sink in unit
order. :class:`StageTimes` says which stage limits the job.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from onnxaccel.scale.datasets import Unit
from onnxaccel.scale.worker import BatchWorker, UnitResult

Sink = Callable[[UnitResult], None]
#: Units read ahead of the run (and shared-memory slots of decoded images).
DEPTH = 4
#: Units whose results may wait for the writer (their outputs only: ~256 KB a unit for 64 rows of 1,000 floats).
WRITE_AHEAD = 64
_END = object()
#: Units the first instance finishes before the job decides whether further instances are worth building (their
#: build and first run compete with its runs for the GPU: worker.join_if_worth).
JOIN_AFTER_UNITS = 2


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


def merged(parts: Sequence[StageTimes]) -> StageTimes:
    """The stage times of runs made one after another (a job's shape groups) as one: seconds and units summed,
    the largest worker counts, the first decoder, every note once."""
    if len(parts) == 1:
        return parts[0]
    out = StageTimes()
    for part in parts:
        for name in ("wall_s", "read_s", "decode_s", "wait_for_device_s", "starved_s", "run_s", "write_s", "units",
                     "units_run"):
            setattr(out, name, getattr(out, name) + getattr(part, name))
        for name in ("read_workers", "decode_workers", "run_instances"):
            setattr(out, name, max(getattr(out, name), getattr(part, name)))
        out.host_copies = out.host_copies or part.host_copies
        out.decoder, out.decoder_reason = out.decoder or part.decoder, out.decoder_reason or part.decoder_reason
        out.notes.extend(n for n in part.notes if n not in out.notes)
    return out


def _pump(worker: BatchWorker, source, units: Sequence[Unit], sink: Sink, depth: int, times: StageTimes) -> None:
    """The three stages: a reader thread, the run in this thread, a writer thread."""
    ready: queue.Queue = queue.Queue(maxsize=depth)
    # Results wait here for the writer: a shard's parquet write and fsync take 100+ ms at once, and a queue as
    # short as ``ready`` made every run wait out each one.
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
    finished = [0, 0.0]  # units finished, perf_counter() of the first unit handed to the runner

    def finish_oldest() -> None:
        future, slot = inflight.popleft()
        try:
            result = future.result()
        finally:
            source.release(slot)
        times.run_s += result.run_s
        written.put(result)
        finished[0] += 1
        if finished[0] == JOIN_AFTER_UNITS and worker.planned_instances > worker.instances:
            unit_s = (time.perf_counter() - finished[1]) / finished[0]
            times.notes.append(worker.join_if_worth((len(units) - finished[0]) * unit_s))

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
            if not finished[1]:
                finished[1] = time.perf_counter()
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
