"""Timing loops and latency statistics.

The loop does as little as possible between two clock reads: with IO binding one call to
``run_with_iobinding``; without it one ``session.run`` with host arrays (what most guides measure).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.engines.base import Runner

#: Coefficient of variation above which a measurement is flagged as unstable.
UNSTABLE_CV = 0.10


@dataclass(frozen=True)
class LatencyStats:
    """Per-call latency in milliseconds."""

    count: int
    mean: float
    stddev: float
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    p999: float
    max: float

    @classmethod
    def from_seconds(cls, samples: list[float] | np.ndarray) -> LatencyStats:
        ms = np.asarray(samples, dtype=np.float64) * 1e3
        if ms.size == 0:
            raise ValueError("no samples")
        q = np.percentile(ms, [50, 90, 95, 99, 99.9])
        return cls(int(ms.size), float(ms.mean()), float(ms.std(ddof=1) if ms.size > 1 else 0.0),
                   float(ms.min()), *(float(v) for v in q), float(ms.max()))

    @property
    def cv(self) -> float:
        return self.stddev / self.mean if self.mean else 0.0

    @property
    def unstable(self) -> bool:
        return self.cv > UNSTABLE_CV

    def to_dict(self) -> dict:
        return {
            "count": self.count, "mean_ms": self.mean, "stddev_ms": self.stddev, "min_ms": self.min,
            "p50_ms": self.p50, "p90_ms": self.p90, "p95_ms": self.p95, "p99_ms": self.p99,
            "p99_9_ms": self.p999, "max_ms": self.max, "cv": self.cv, "unstable": self.unstable,
        }


@dataclass(frozen=True)
class TimingResult:
    latency: LatencyStats
    batch: int
    first_run_ms: float
    iobinding: bool
    wall_seconds: float
    samples_ms: list[float] = field(default_factory=list, repr=False)

    @property
    def throughput(self) -> float:
        """Items per second at the median latency."""
        return self.batch / (self.latency.p50 / 1e3) if self.latency.p50 else 0.0

    def to_dict(self) -> dict:
        return {
            "batch": self.batch, "iobinding": self.iobinding, "first_run_ms": self.first_run_ms,
            "throughput_items_per_s": self.throughput, "wall_seconds": self.wall_seconds,
            "latency": self.latency.to_dict(),
        }


def measure(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    *,
    batch: int = 1,
    warmup: int = 10,
    runs: int | None = 100,
    duration: float | None = None,
    iobinding: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> TimingResult:
    """Time ``runs`` calls (or calls for ``duration`` seconds) after ``warmup`` untimed ones.

    The first call is timed apart (``first_run_ms``): on compiling providers it includes lazy compilation.
    """
    if iobinding:
        bound = runner.bind(feeds)
        call = bound.run
    else:
        host = dict(feeds)

        def call() -> None:
            runner.run(host)

    clock = time.perf_counter
    start = clock()
    call()
    first = clock() - start
    for _ in range(max(0, warmup - 1)):
        call()
    samples: list[float] = []
    total = runs if runs is not None else 0
    wall_start = clock()
    while True:
        t0 = clock()
        call()
        samples.append(clock() - t0)
        n = len(samples)
        if progress is not None and (n % 10 == 0):
            progress(n, total)
        if runs is not None and n >= runs:
            break
        if duration is not None and clock() - wall_start >= duration and n >= 2:
            break
    return TimingResult(
        latency=LatencyStats.from_seconds(samples), batch=batch, first_run_ms=first * 1e3,
        iobinding=iobinding, wall_seconds=clock() - wall_start, samples_ms=[s * 1e3 for s in samples],
    )
