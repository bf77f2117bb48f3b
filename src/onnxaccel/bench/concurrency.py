"""Concurrent requests on one session: N threads each call the model back to back.

ONNX Runtime allows concurrent ``Run`` calls on one session and releases the GIL while it runs
(onnxruntime_pybind_state.cc wraps Run in ``py::gil_scoped_release``), so Python threads overlap real work.
Each thread gets its own IO binding (a binding is not thread-safe). CUDA graphs cannot be replayed from
several threads on one session ("Multi-threaded usage is currently not supported", ORT CUDA EP docs,
"Using CUDA Graphs"), so the sweep skips that combination.

Throughput here is what the threads completed over the wall time; latency percentiles are per call.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.bench.stats import LatencyStats
from onnxaccel.bench.timing import TimingResult
from onnxaccel.engines.base import Runner


def measure_concurrent(
    runner: Runner | Sequence[Runner],
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
    after the other, each in its own thread, before any timed call.
    The result's ``outputs()`` gives the outputs of the first call site (its binding, when bound).
    """
    runners = list(runner) if isinstance(runner, Sequence) else [runner] * concurrency
    separate = isinstance(runner, Sequence)
    concurrency = len(runners)
    calls: list[Callable[[], object]] = []
    bindings = []
    for each in runners:
        if iobinding:
            bound = each.bind(feeds)
            bindings.append(bound)
            calls.append(bound.run)
        else:
            calls.append(functools.partial(each.run, dict(feeds)))
    firsts = [0.0] * concurrency
    # Instances warm up one at a time, each in its own thread: ONNX Runtime keeps a session's captured CUDA
    # graph per calling thread, so the capture must happen in the thread that replays it, and while one
    # session captures no other may touch the GPU ("operation not permitted when stream is capturing", seen
    # on an H200 when two sessions captured at once).
    turn = threading.Lock() if separate else contextlib.nullcontext()
    samples: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[BaseException] = []
    ready = threading.Barrier(concurrency + 1)
    stop = threading.Event()
    total = (runs or 0) * concurrency

    def worker(index: int) -> None:
        call, mine, clock = calls[index], samples[index], time.perf_counter
        try:
            with turn:
                t0 = clock()
                call()
                firsts[index] = clock() - t0
                for _ in range(max(0, warmup - 1)):
                    call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)
            stop.set()
        ready.wait()
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

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    ready.wait()
    start = time.perf_counter()
    while any(t.is_alive() for t in threads):
        time.sleep(0.02)
        if progress is not None:
            progress(sum(len(s) for s in samples), total)
        if duration is not None and time.perf_counter() - start >= duration:
            stop.set()
    wall = time.perf_counter() - start
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    merged = [s for per_thread in samples for s in per_thread]
    if not merged:
        raise RuntimeError("no call completed")
    stats = LatencyStats.from_seconds(merged)
    return _ConcurrentTiming(latency=stats, batch=batch, first_run_ms=max(firsts) * 1e3, iobinding=iobinding,
                             wall_seconds=wall, calls_per_sample=1, samples_ms=[s * 1e3 for s in merged],
                             outputs=bindings[0].outputs if bindings else calls[0])


@dataclass(frozen=True)
class _ConcurrentTiming(TimingResult):
    """With several requests in flight, throughput is what completed over the wall time. ``outputs()``: the
    outputs of the first call site (the same session and binding that was timed, so a captured graph is
    replayed with the addresses it was captured with)."""

    outputs: Callable[[], object] | None = field(default=None, compare=False, repr=False)

    @property
    def throughput(self) -> float:
        return self.wall_throughput
