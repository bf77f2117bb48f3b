"""Concurrent requests: N threads each call the model back to back, on one session or on one each (instances).

The threads are a :class:`onnxaccel.engines.pool.RunnerPool`'s, as a server's are: each instance binds its
inputs and warms up in the thread that runs it, and separate instances warm up one at a time through the
process's capture gate (ONNX Runtime keeps a session's captured CUDA graph per calling thread, and while one
session captures no other may touch the GPU: "operation not permitted when stream is capturing" when two
sessions capture at once). The timed loop calls the bound run (or ``runner.run``) itself,
nothing around it.

ONNX Runtime allows concurrent ``Run`` calls on one session and releases the GIL while it runs
(onnxruntime_pybind_state.cc wraps Run in ``py::gil_scoped_release``), so Python threads overlap real work.
Each thread gets its own IO binding (a binding is not thread-safe). CUDA graphs cannot be replayed from
several threads on one session ("Multi-threaded usage is currently not supported", ORT CUDA EP docs,
"Using CUDA Graphs"), so the sweep skips that combination.

Throughput here is what the threads completed over the wall time; latency percentiles are per call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.bench.stats import LatencyStats
from onnxaccel.bench.timing import TimingResult
from onnxaccel.engines.base import Runner
from onnxaccel.engines.pool import RunnerPool


def measure_concurrent(
    runner: Runner | Sequence[Runner] | RunnerPool,
    feeds: Mapping[str, np.ndarray],
    *,
    concurrency: int,
    batch: int = 1,
    warmup: int = 10,
    runs: int | None = 100,
    duration: float | None = None,
    iobinding: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> TimingResult:
    """``runs`` calls per thread (or calls for ``duration`` seconds) after ``warmup`` per thread.

    ``first_run_ms`` is the slowest first call of any thread. ``runner`` may be a list of runners (instances):
    thread ``i`` then calls runner ``i``, and ``concurrency`` is their number. Instances are warmed up one
    after the other, each in its own thread, before any timed call. A RunnerPool given is used as it is (its
    instances, its warm-up rule) and left open; otherwise one is made for the call and closed after it (the
    runners stay open: they are the caller's).
    The result's ``outputs()`` gives the outputs of the first call site (its binding, when bound).
    """
    if isinstance(runner, RunnerPool):
        return _measure(runner, feeds, batch, warmup, runs, duration, iobinding, progress)
    separate = isinstance(runner, Sequence)
    runners = list(runner) if separate else [runner] * concurrency
    pool = RunnerPool(runners, owns=False, one_capture_at_a_time=separate, name="bench")
    try:
        return _measure(pool, feeds, batch, warmup, runs, duration, iobinding, progress)
    finally:
        pool.close()


def _measure(pool: RunnerPool, feeds: Mapping[str, np.ndarray], batch: int, warmup: int, runs: int | None,
             duration: float | None, iobinding: bool, progress: Callable[[int, int], None] | None) -> TimingResult:
    concurrency = len(pool)
    calls: list[Callable[[], object] | None] = [None] * concurrency
    firsts = [0.0] * concurrency
    samples: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[BaseException] = []
    ready = threading.Barrier(concurrency + 1)
    stop = threading.Event()
    total = (runs or 0) * concurrency

    def worker(index: int) -> None:
        mine, clock = samples[index], time.perf_counter
        try:
            call = calls[index] = pool.call(index, feeds, iobinding=iobinding)  # bound in this thread
            with pool.warm_turn():
                t0 = clock()
                call()
                firsts[index] = clock() - t0
                for _ in range(max(0, warmup - 1)):
                    call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)
            stop.set()
        try:
            ready.wait()
        except threading.BrokenBarrierError:  # the caller gave up (an interrupt)
            return
        try:
            while not stop.is_set():
                t0 = clock()
                call()
                mine.append(clock() - t0)
                if runs is not None and len(mine) >= runs:
                    break
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()

    futures = [pool.submit(i, worker, i) for i in range(concurrency)]
    try:
        ready.wait()
        start = time.perf_counter()
        while not all(f.done() for f in futures):
            time.sleep(0.02)
            if progress is not None:
                progress(sum(len(s) for s in samples), total)
            if duration is not None and time.perf_counter() - start >= duration:
                stop.set()
        wall = time.perf_counter() - start
    finally:  # also on an interrupt: the loops end after their current call
        stop.set()
        ready.abort()
    for future in futures:
        future.result()
    if errors:
        raise errors[0]
    merged = [s for per_thread in samples for s in per_thread]
    if not merged:
        raise RuntimeError("no call completed")
    stats = LatencyStats.from_seconds(merged)
    outputs = pool.bound_outputs(0) or calls[0]
    return _ConcurrentTiming(latency=stats, batch=batch, first_run_ms=max(firsts) * 1e3, iobinding=iobinding,
                             wall_seconds=wall, calls_per_sample=1, samples_ms=[s * 1e3 for s in merged],
                             outputs=outputs)


@dataclass(frozen=True)
class _ConcurrentTiming(TimingResult):
    """With several requests in flight, throughput is what completed over the wall time. ``outputs()``: the
    outputs of the first call site (the same session and binding that was timed, so a captured graph is
    replayed with the addresses it was captured with)."""

    outputs: Callable[[], object] | None = field(default=None, compare=False, repr=False)

    @property
    def throughput(self) -> float:
        """Calls completed per second of wall time, times the batch."""
        return self.wall_throughput
