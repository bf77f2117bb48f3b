"""Statistics and timing loops, with controlled inputs."""

from __future__ import annotations

import numpy as np
import pytest

from onnxaccel.bench.stats import LatencyStats, histogram, keep_samples
from onnxaccel.bench.timing import measure_call, measure_transfers
from onnxaccel.engines.base import BoundRun


def test_latency_stats_match_numpy_and_round_trip():
    ms = np.random.default_rng(1).gamma(4.0, 0.5, size=5000)
    stats = LatencyStats.from_ms(ms)
    assert stats.count == 5000 and stats.min == ms.min() and stats.max == ms.max()
    assert stats.p50 == pytest.approx(np.percentile(ms, 50)) and stats.p999 == pytest.approx(np.percentile(ms, 99.9))
    assert stats.min <= stats.p50 <= stats.p90 <= stats.p95 <= stats.p99 <= stats.p999 <= stats.max
    assert stats.stddev == pytest.approx(ms.std(ddof=1)) and stats.cv == pytest.approx(stats.stddev / stats.mean)
    assert LatencyStats.from_dict(stats.to_dict()) == stats


def test_high_spread_is_flagged_unstable():
    assert not LatencyStats.from_ms([10.0, 10.1, 9.9, 10.0]).unstable
    assert LatencyStats.from_ms([10.0, 30.0, 5.0, 12.0]).unstable


def test_histogram_folds_outliers_into_the_end_bins():
    samples = [1.0] * 50 + [1.1] * 50 + [500.0]
    hist = histogram(samples, bins=10)
    assert sum(hist.counts) == len(samples) and len(hist.edges_ms) == 11
    assert hist.edges_ms[-1] < 500.0  # one outlier does not stretch the axis to 500 ms


def test_keep_samples_subsamples_evenly_in_time_order():
    kept = keep_samples([float(i) for i in range(10_000)], limit=100)
    assert len(kept) == 100 and kept == sorted(kept) and kept[0] == 0.0 and kept[-1] >= 9800


class Counter:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1


def test_measure_counts_warmup_first_call_and_runs_apart():
    call = Counter()
    result = measure_call(call, batch=4, warmup=5, runs=40, calls_per_sample=1)
    assert call.calls == 5 + 40  # first + 4 more warmup, then 40 timed
    assert result.latency.count == 40 and result.calls == 40 and result.first_run_ms >= 0
    assert result.throughput == pytest.approx(4 / (result.latency.p50 / 1e3))


def test_fast_calls_are_timed_in_groups():
    call = Counter()
    result = measure_call(call, warmup=20, runs=30)  # a no-op call: far below 100 us
    assert result.calls_per_sample > 1
    assert result.latency.count == 30 and call.calls == 20 + 30 * result.calls_per_sample


def test_duration_mode_stops_on_time():
    import time

    result = measure_call(lambda: time.sleep(0.002), warmup=1, runs=None, duration=0.1)
    assert 2 <= result.latency.count <= 60 and result.wall_seconds >= 0.1


class FakeBound(BoundRun):
    def __init__(self):
        self.updates = self.downloads = 0

    def update(self, feeds):
        self.updates += 1

    def run(self):
        pass

    def outputs(self):
        self.downloads += 1
        return {}


def test_transfer_split_times_uploads_and_downloads():
    bound = FakeBound()
    split = measure_transfers(bound, {}, compute_ms=2.0, reps=7)
    assert bound.updates == bound.downloads == 7 == split.reps
    assert split.compute_ms == 2.0 and split.total_ms >= 2.0 and split.to_dict()["method"] == "explicit-copy"
