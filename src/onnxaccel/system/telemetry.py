"""A background GPU sampler with one API over NVML, amdsmi and rocm-smi, and mean/peak summaries.

    sampler = GpuSampler(interval=0.1).start()
    ... run the workload ...
    summary = sampler.stop()          # TelemetrySummary: per GPU mean/peak utilization, memory, power...

A machine without GPUs gives an empty, valid summary (``gpus == []``, the reasons in ``notes``). The
sampler measures its own cost: CPU time of its thread per sample (``time.thread_time``), wall time per
read, and for subprocess backends the CPU time of the tool's process (``getrusage(RUSAGE_CHILDREN)``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from onnxaccel.errors import UsageError
from onnxaccel.system.telemetry_backends import BackendUnavailable, GpuSample, open_backends

SCHEMA = "onnxaccel.telemetry/1"
METRICS = ("utilization_pct", "memory_used_bytes", "power_w", "temperature_c", "gfx_clock_mhz", "mem_clock_mhz")


@dataclass
class MetricStats:
    """Running count, sum and peak of one metric; readings that are None (no sensor) are skipped."""
    count: int = 0
    total: float = 0.0
    peak: float | None = None

    def add(self, value: float | None) -> None:
        """Count ``value`` (None is skipped)."""
        if value is None:
            return
        self.count += 1
        self.total += value
        self.peak = value if self.peak is None else max(self.peak, value)

    @property
    def mean(self) -> float | None:
        """Mean of the values counted, or None when there were none."""
        return self.total / self.count if self.count else None

    def to_dict(self) -> dict:
        """Mean and peak as JSON-ready values."""
        return {"mean": self.mean, "peak": self.peak}


@dataclass
class GpuStats:
    """Mean and peak of every metric of one GPU over a sampling run (the aggregate of its GpuSamples)."""
    gpu: int
    name: str
    vendor: str
    samples: int = 0
    memory_total_bytes: int | None = None
    metrics: dict[str, MetricStats] = field(default_factory=lambda: {m: MetricStats() for m in METRICS})

    def add(self, sample: GpuSample) -> None:
        """Fold one reading of this GPU into the statistics."""
        self.samples += 1
        self.memory_total_bytes = sample.memory_total_bytes or self.memory_total_bytes
        for metric in METRICS:
            self.metrics[metric].add(getattr(sample, metric))

    def to_dict(self) -> dict:
        """The statistics as JSON-ready values: one {mean, peak} per metric."""
        return {"gpu": self.gpu, "name": self.name, "vendor": self.vendor, "samples": self.samples,
                "memory_total_bytes": self.memory_total_bytes,
                **{metric: stats.to_dict() for metric, stats in self.metrics.items()}}


@dataclass
class SamplerOverhead:
    """What sampling cost, per sample (one read of every GPU)."""

    samples: int
    interval_s: float
    thread_cpu_ms: float
    wall_ms: float
    child_cpu_ms: float

    @property
    def cpu_fraction(self) -> float:
        """Share of one CPU core the sampler used: (thread + tool CPU per sample) / interval."""
        return (self.thread_cpu_ms + self.child_cpu_ms) / 1e3 / self.interval_s if self.interval_s else 0.0

    def to_dict(self) -> dict:
        """The cost as JSON-ready values, per sample and as a share of one CPU core."""
        return {"samples": self.samples, "interval_s": self.interval_s,
                "thread_cpu_ms_per_sample": self.thread_cpu_ms, "wall_ms_per_sample": self.wall_ms,
                "child_cpu_ms_per_sample": self.child_cpu_ms, "cpu_fraction_of_one_core": self.cpu_fraction}


@dataclass
class TelemetrySummary:
    """What a sampling run saw: per-GPU statistics, the backends used, the sampler's own cost, notes
    and errors."""
    backends: list[str]
    duration_s: float
    interval_s: float
    gpus: list[GpuStats]
    overhead: SamplerOverhead
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def gpu(self, index: int, vendor: str | None = None) -> GpuStats | None:
        """The statistics of GPU ``index`` (of ``vendor`` when given), or None."""
        return next((g for g in self.gpus if g.gpu == index and vendor in (None, g.vendor)), None)

    def to_dict(self) -> dict:
        """The summary as JSON-ready values, with its schema version."""
        return {"schema": SCHEMA, "backends": self.backends, "duration_s": self.duration_s,
                "interval_s": self.interval_s, "gpus": [g.to_dict() for g in self.gpus],
                "overhead": self.overhead.to_dict(), "notes": self.notes, "errors": self.errors}


class TelemetryRecorder:
    """Accumulates readings into per-GPU stats and the cost of taking them; shared by sampler and monitor."""

    def __init__(self, backends: Sequence, interval: float, notes: Sequence[str] = ()):
        self.backends, self.interval, self.notes = list(backends), interval, list(notes)
        self.stats: dict[tuple[str, int], GpuStats] = {}
        self.errors: list[str] = []
        self.samples = 0
        self.thread_cpu_s = self.wall_s = 0.0
        self.started = time.perf_counter()

    def read(self) -> list[GpuSample]:
        """Read every backend once, timing it; a failing backend is recorded, not raised."""
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        readings: list[GpuSample] = []
        for backend in self.backends:
            try:
                readings.extend(backend.read())
            except (BackendUnavailable, Exception) as exc:  # noqa: BLE001 - a flaky driver must not kill the run
                if len(self.errors) < 20:
                    self.errors.append(f"{backend.name}: {exc}")
        self.thread_cpu_s += time.thread_time() - cpu0
        self.wall_s += time.perf_counter() - wall0
        self.samples += 1
        for sample in readings:
            key = (sample.vendor, sample.gpu)
            if key not in self.stats:
                self.stats[key] = GpuStats(sample.gpu, sample.name, sample.vendor)
            self.stats[key].add(sample)
        return readings

    def summary(self) -> TelemetrySummary:
        """The statistics so far and the cost per sample of taking them."""
        n = max(self.samples, 1)
        child = sum(getattr(b, "child_cpu_s", 0.0) for b in self.backends)
        overhead = SamplerOverhead(self.samples, self.interval, self.thread_cpu_s / n * 1e3, self.wall_s / n * 1e3,
                                   child / n * 1e3)
        gpus = sorted(self.stats.values(), key=lambda g: (g.vendor, g.gpu))
        return TelemetrySummary([b.name for b in self.backends], time.perf_counter() - self.started, self.interval,
                                gpus, overhead, list(self.notes), list(self.errors))


def check_interval(interval: float) -> float:
    """The interval as a float; a UsageError that says what to pass for a non-positive or NaN one."""
    if not isinstance(interval, (int, float)) or math.isnan(interval) or interval <= 0:
        raise UsageError(f"The sampling interval must be a positive number of seconds, got {interval!r}.",
                         "e.g. --interval 0.5 (the drivers refresh utilization every ~0.1-1 s).")
    return float(interval)


class GpuSampler:
    """Samples every GPU every ``interval`` seconds in a background thread until :meth:`stop`."""

    def __init__(self, interval: float = 0.1, backends: Sequence | None = None):
        self.interval = check_interval(interval)
        self._given = list(backends) if backends is not None else None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.recorder: TelemetryRecorder | None = None

    def start(self) -> GpuSampler:
        """Open the backends (or the given ones) and start sampling in a background thread; a machine
        without GPUs starts nothing and gives an empty summary."""
        if self._thread is not None:
            raise RuntimeError("GpuSampler.start() called twice")
        if self._given is None:
            backends, notes = open_backends()
        else:
            backends, notes = [], []
            for backend in self._given:
                try:
                    backend.open()
                    backends.append(backend)
                except BackendUnavailable as exc:
                    notes.append(f"{backend.name}: {exc}")
        self.recorder = TelemetryRecorder(backends, self.interval, notes)
        if backends:
            self._thread = threading.Thread(target=self._run, name="onnxaccel-gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        next_at = time.perf_counter()
        while True:
            self.recorder.read()
            next_at += self.interval
            if self._stop.wait(max(0.0, next_at - time.perf_counter())):
                return

    def stop(self) -> TelemetrySummary:
        """Stop sampling, close the backends and return the summary."""
        if self.recorder is None:
            raise RuntimeError("GpuSampler.stop() before start()")
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for backend in self.recorder.backends:
            backend.close()
        return self.recorder.summary()

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.recorder is not None and not self._stop.is_set():
            self.summary = self.stop()
