"""Latency statistics: percentiles, spread, stability, histograms, and the noise of a median.

All times are milliseconds. Percentiles use numpy's default (linear interpolation between order statistics),
the method trtexec's ``--percentile`` and perf_analyzer also interpolate with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Coefficient of variation above which a measurement is flagged as unstable. trtexec warns at 2.5% for GPU
#: compute time alone ("GPU compute time is unstable", sampleReporting.cpp); host-side wall-clock latency of a
#: Python call is noisier, so the warning here starts at 10%.
UNSTABLE_CV = 0.10

#: Samples kept per cell in a report (evenly spaced in time order), enough for a histogram and a CDF.
KEEP_SAMPLES = 1000


@dataclass(frozen=True)
class LatencyStats:
    """Per-sample latency in milliseconds."""

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
    def from_seconds(cls, samples: Sequence[float] | np.ndarray) -> LatencyStats:
        """Statistics of latencies given in seconds."""
        return cls.from_ms(np.asarray(samples, dtype=np.float64) * 1e3)

    @classmethod
    def from_ms(cls, samples: Sequence[float] | np.ndarray) -> LatencyStats:
        """Statistics of latencies given in milliseconds; ValueError when there are none."""
        ms = np.asarray(samples, dtype=np.float64)
        if ms.size == 0:
            raise ValueError("no samples")
        q = np.percentile(ms, [50, 90, 95, 99, 99.9])
        return cls(int(ms.size), float(ms.mean()), float(ms.std(ddof=1) if ms.size > 1 else 0.0),
                   float(ms.min()), *(float(v) for v in q), float(ms.max()))

    @property
    def cv(self) -> float:
        """Coefficient of variation: stddev / mean."""
        return self.stddev / self.mean if self.mean else 0.0

    @property
    def unstable(self) -> bool:
        """True when the coefficient of variation exceeds ``UNSTABLE_CV`` (the figures are noisy)."""
        return self.cv > UNSTABLE_CV

    def median_noise(self) -> float:
        """Relative standard error of the median (asymptotic: 1.2533 * sigma / sqrt(n), for a normal
        distribution; Kendall & Stuart), as a fraction of the median. Latency has a long right tail (a few
        preempted calls), so sigma is the smaller of the standard deviation and (p90 - p50) / 1.2816, the
        spread of the body of the distribution (z = 1.2816 at the 90th percentile of a normal)."""
        if self.count < 2 or not self.p50:
            return math.inf
        sigma = self.stddev
        if self.p90 > self.p50:
            sigma = min(sigma, (self.p90 - self.p50) / 1.2816)
        return 1.2533 * sigma / math.sqrt(self.count) / self.p50

    def to_dict(self) -> dict:
        """JSON-ready form, every figure in milliseconds."""
        return {
            "count": self.count, "mean_ms": self.mean, "stddev_ms": self.stddev, "min_ms": self.min,
            "p50_ms": self.p50, "p90_ms": self.p90, "p95_ms": self.p95, "p99_ms": self.p99,
            "p99_9_ms": self.p999, "max_ms": self.max, "cv": self.cv, "unstable": self.unstable,
        }

    @classmethod
    def from_dict(cls, data: dict) -> LatencyStats:
        """Read statistics back from their JSON form."""
        return cls(int(data["count"]), float(data["mean_ms"]), float(data["stddev_ms"]), float(data["min_ms"]),
                   float(data["p50_ms"]), float(data["p90_ms"]), float(data["p95_ms"]), float(data["p99_ms"]),
                   float(data["p99_9_ms"]), float(data["max_ms"]))


@dataclass(frozen=True)
class Histogram:
    """Counts of samples per bin; ``edges_ms`` has one more entry than ``counts``."""

    edges_ms: tuple[float, ...]
    counts: tuple[int, ...]

    def to_dict(self) -> dict:
        """JSON-ready form of the histogram."""
        return {"edges_ms": list(self.edges_ms), "counts": list(self.counts)}

    @classmethod
    def from_dict(cls, data: dict) -> Histogram:
        """Read a histogram back from its JSON form."""
        return cls(tuple(float(e) for e in data["edges_ms"]), tuple(int(c) for c in data["counts"]))


def histogram(samples_ms: Sequence[float], bins: int = 30) -> Histogram:
    """Equal-width bins between the 0.5th and 99.5th percentile, with the tails folded into the end bins,
    so one outlier does not squeeze every other sample into a single bar."""
    ms = np.asarray(samples_ms, dtype=np.float64)
    if ms.size == 0:
        return Histogram((), ())
    lo, hi = (float(v) for v in np.percentile(ms, [0.5, 99.5]))
    if hi <= lo:
        lo, hi = float(ms.min()), float(ms.max())
    if hi <= lo:
        hi = lo + max(abs(lo) * 1e-3, 1e-6)
    counts, edges = np.histogram(np.clip(ms, lo, hi), bins=bins, range=(lo, hi))
    return Histogram(tuple(float(e) for e in edges), tuple(int(c) for c in counts))


def keep_samples(samples_ms: Sequence[float], limit: int = KEEP_SAMPLES) -> list[float]:
    """At most ``limit`` samples, evenly spaced over the run (time order kept), rounded to 1 ns."""
    values = list(samples_ms)
    if len(values) > limit:
        step = len(values) / limit
        values = [values[int(i * step)] for i in range(limit)]
    return [round(v, 6) for v in values]
