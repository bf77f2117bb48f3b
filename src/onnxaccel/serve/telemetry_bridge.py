"""GPU readings for /metrics from the telemetry sampler's backends (onnxaccel.system.telemetry: NVML,
amdsmi, rocm-smi behind one API).

The server reads the GPUs when Prometheus scrapes, at most once per ``interval_s`` (a cached reading answers
scrapes in between), instead of sampling in a background thread: a scrape every 15 s costs one read, and the
gauges show the value at scrape time, which is what a Prometheus gauge means.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from onnxaccel.system.telemetry import TelemetryRecorder
from onnxaccel.system.telemetry_backends import open_backends


def _noop() -> None:
    return None


def gpu_source(interval_s: float, backends: Sequence | None = None
               ) -> tuple[Callable[[], list[dict]] | None, Callable[[], None]]:
    """(a function returning the latest readings as dicts, a function closing the backends); (None, noop)
    when no GPU backend opens here. ``backends`` (already opened) replaces discovery, for tests."""
    if backends is None:
        backends, notes = open_backends()
    else:
        backends, notes = list(backends), []
    if not backends:
        return None, _noop
    recorder = TelemetryRecorder(backends, interval_s, notes)
    lock = threading.Lock()
    cache: dict = {"at": float("-inf"), "readings": []}

    def source() -> list[dict]:
        with lock:
            now = time.monotonic()
            if now - cache["at"] >= interval_s:
                cache["readings"] = [
                    {"index": s.gpu, "name": s.name, "vendor": s.vendor, "utilization_pct": s.utilization_pct,
                     "memory_used_bytes": s.memory_used_bytes, "memory_total_bytes": s.memory_total_bytes,
                     "power_watts": s.power_w}
                    for s in recorder.read()
                ]
                cache["at"] = now
            return cache["readings"]

    def stop() -> None:
        for backend in backends:
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - closing a driver handle at exit must not fail the shutdown
                pass

    return source, stop
