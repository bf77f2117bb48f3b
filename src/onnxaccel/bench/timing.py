"""Timing loops: one inference call measured many times, with as little as possible between clock reads.

With IO binding the timed call is one ``run_with_iobinding`` (inputs and outputs stay on the device); without
it one ``session.run`` with numpy arrays (what most guides measure). ONNX Runtime synchronizes the device at
the end of every Run by default (the CUDA EP's ``OnRunEnd`` synchronizes its stream unless the run option
``disable_synchronize_execution_providers`` is set; cuda_execution_provider.cc), so a host clock around the
call measures the whole inference.

Calls faster than :data:`FAST_CALL_S` are timed in groups (``calls_per_sample`` consecutive calls per
sample), as trtexec's ``--avgRuns`` does (default 10 there): one clock read costs ~0.1 us, which would
otherwise be several percent of a 5 us call.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from onnxaccel import startup
from onnxaccel.bench.stats import LatencyStats
from onnxaccel.engines.base import BoundRun, Runner

__all__ = ["FAST_CALL_S", "LatencyStats", "TimingResult", "TransferSplit", "measure", "measure_call",
           "measure_transfers"]

#: Calls shorter than this are grouped so that one sample lasts at least this long.
FAST_CALL_S = 100e-6
#: Samples between two progress callbacks / duration checks (kept out of the hot loop).
_BLOCK = 50


@dataclass(frozen=True)
class TimingResult:
    """Latency statistics and throughput of one timed loop."""
    latency: LatencyStats
    batch: int
    first_run_ms: float
    iobinding: bool
    wall_seconds: float
    calls_per_sample: int = 1
    samples_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def calls(self) -> int:
        """Session calls made in the timed loop (samples x calls per sample)."""
        return self.latency.count * self.calls_per_sample

    @property
    def throughput(self) -> float:
        """Items per second at the median latency (one call at a time)."""
        return self.batch / (self.latency.p50 / 1e3) if self.latency.p50 else 0.0

    @property
    def wall_throughput(self) -> float:
        """Items per second over the whole timed loop, loop overhead included."""
        return self.batch * self.calls / self.wall_seconds if self.wall_seconds else 0.0

    def to_dict(self) -> dict:
        """JSON-ready form of the timing."""
        return {
            "batch": self.batch, "iobinding": self.iobinding, "first_run_ms": self.first_run_ms,
            "throughput_items_per_s": self.throughput, "wall_throughput_items_per_s": self.wall_throughput,
            "wall_seconds": self.wall_seconds, "calls_per_sample": self.calls_per_sample, "calls": self.calls,
            "latency": self.latency.to_dict(),
        }


def measure_call(
    call: Callable[[], object],
    *,
    batch: int = 1,
    warmup: int = 10,
    runs: int | None = 100,
    duration: float | None = None,
    calls_per_sample: int | None = None,
    iobinding: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> TimingResult:
    """Time ``call``: the first call apart (``first_run_ms``: lazy compilation, CUDA graph capture, cuDNN
    algorithm search happen there), then ``warmup - 1`` untimed calls, then ``runs`` samples (or samples for
    ``duration`` seconds, at least 2). ``calls_per_sample`` None = automatic (see module doc)."""
    clock = time.perf_counter
    start = clock()
    with startup.stage("first run", detail=f"b{batch}"):
        call()
    first = clock() - start
    warm_start = clock()
    extra = max(0, warmup - 1)
    with startup.stage("warm-up", detail=f"{extra} run(s)"):
        for _ in range(extra):
            call()
    per_call = (clock() - warm_start) / extra if extra else first
    k = calls_per_sample or (max(1, min(1000, math.ceil(FAST_CALL_S / per_call))) if per_call > 0 else 1)
    total = runs if runs is not None else 0
    samples: list[float] = []
    append = samples.append
    inner = range(k)
    wall_start = clock()
    while True:
        block = _BLOCK if runs is None else min(_BLOCK, runs - len(samples))
        if k == 1:
            for _ in range(block):
                t0 = clock()
                call()
                append(clock() - t0)
        else:
            for _ in range(block):
                t0 = clock()
                for _ in inner:
                    call()
                append((clock() - t0) / k)
        n = len(samples)
        if progress is not None:
            progress(n, total)
        if runs is not None and n >= runs:
            break
        if duration is not None and clock() - wall_start >= duration and n >= 2:
            break
        if runs is None and duration is None:
            break
    wall = clock() - wall_start
    return TimingResult(
        latency=LatencyStats.from_seconds(samples), batch=batch, first_run_ms=first * 1e3, iobinding=iobinding,
        wall_seconds=wall, calls_per_sample=k, samples_ms=[s * 1e3 for s in samples],
    )


def measure(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    *,
    batch: int = 1,
    warmup: int = 10,
    runs: int | None = 100,
    duration: float | None = None,
    iobinding: bool = True,
    calls_per_sample: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> TimingResult:
    """Time a runner: device-resident inputs/outputs (``iobinding``) or numpy in/out."""
    # functools.partial is implemented in C: no extra Python frame per call.
    call = runner.bind(feeds).run if iobinding else functools.partial(runner.run, dict(feeds))

    return measure_call(call, batch=batch, warmup=warmup, runs=runs, duration=duration,
                        calls_per_sample=calls_per_sample, iobinding=iobinding, progress=progress)


@dataclass(frozen=True)
class TransferSplit:
    """Host-to-device copy of every input, device compute (the IO-bound run), device-to-host copy of every
    output, each a median in milliseconds. Copies are timed explicitly through the bound run
    (``update`` = ``OrtValue.update_inplace``, ``outputs`` = ``copy_outputs_to_cpu``)."""

    h2d_ms: float
    compute_ms: float
    d2h_ms: float
    reps: int
    method: str = "explicit-copy"

    @property
    def total_ms(self) -> float:
        """Host-to-device, compute and device-to-host time together."""
        return self.h2d_ms + self.compute_ms + self.d2h_ms

    def to_dict(self) -> dict:
        """JSON-ready form of the split."""
        return {"method": self.method, "h2d_ms": self.h2d_ms, "compute_ms": self.compute_ms, "d2h_ms": self.d2h_ms,
                "total_ms": self.total_ms, "reps": self.reps}


def measure_transfers(bound: BoundRun, feeds: Mapping[str, np.ndarray], compute_ms: float, *,
                      reps: int = 10, budget_s: float = 1.0) -> TransferSplit:
    """Median time of ``reps`` input uploads and output downloads (fewer when they exceed ``budget_s``)."""
    clock = time.perf_counter
    h2d, d2h = [], []
    deadline = clock() + budget_s
    for _ in range(reps):
        t0 = clock()
        bound.update(feeds)
        t1 = clock()
        bound.outputs()
        h2d.append(t1 - t0)
        d2h.append(clock() - t1)
        if clock() > deadline and len(h2d) >= 3:
            break
    return TransferSplit(float(np.median(h2d)) * 1e3, compute_ms, float(np.median(d2h)) * 1e3, len(h2d))
