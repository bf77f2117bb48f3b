"""Where start-up time goes: named stages, timed where they happen, collected per process.

A command's first result (``run``, ``bench``), a server's readiness (``serve``) and a job's first row
(``batch``) all wait on the same stages: importing, reading the model, converting its precision (or finding the
converted copy), building sessions, the first run at each shape (where ONNX Runtime's CUDA EP searches cuDNN
algorithms and MIGraphX compiles), capturing graphs, warming up, starting decoders and worker processes. Code that
does one of them wraps it::

    with startup.stage("session", model="resnet50") as span:
        runner = compile_model(...)
        span.detail = "optimized model loaded"      # optional: a cache hit, a size, ...

and a command reports :func:`summary` (text lines and ``to_dict()`` for ``--json``), or a worker process sends
its spans to its parent (:func:`Spans.from_dict` + :func:`merge`). Stages of threads that ran side by side
overlap: the report gives each stage's sum and the wall time to the first result or to ready, never a sum of
sums as the total.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

SCHEMA = "onnxaccel.startup/1"

#: The stages, in the order they happen; a span of another name is reported after these.
STAGES = ("import", "provider warm-up", "model read", "plan", "variant", "session", "first run", "graph capture",
          "warm-up", "decoder warm-up", "workers", "server")

_LOCK = threading.Lock()
_SPANS: list[Span] = []


def _process_start() -> float:
    """The process's start as a ``time.time()`` value: Linux /proc/self/stat (field 22, clock ticks after
    boot, proc(5)) against /proc/uptime; elsewhere the time this module was imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 overall; fields[0] is field 3 (state)
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


#: Wall-clock time of the process start, and the perf_counter value that corresponds to it.
PROCESS_START = _process_start()
_ORIGIN = time.perf_counter() - (time.time() - PROCESS_START)


@dataclass
class Span:
    """One stage of start-up: its name, seconds, where it started (seconds after the process started), what it
    was for (``model``), what happened (``detail``: a cache hit, the batch size...) and in which process ("" for
    this one; "model process", "worker 0", "batch worker 1" for spans merged from another)."""

    stage: str
    seconds: float = 0.0
    start: float = 0.0
    model: str = ""
    detail: str = ""
    process: str = ""

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"stage": self.stage, "seconds": round(self.seconds, 6), "start": round(self.start, 6),
                "model": self.model, "detail": self.detail, "process": self.process}

    @classmethod
    def from_dict(cls, data: dict) -> Span:
        """The value ``to_dict`` gave."""
        return cls(data["stage"], data["seconds"], data["start"], data.get("model", ""), data.get("detail", ""),
                   data.get("process", ""))


def now() -> float:
    """Seconds since the process started (the scale every span's ``start`` is on)."""
    return time.perf_counter() - _ORIGIN


@contextlib.contextmanager
def stage(name: str, *, model: str = "", detail: str = "") -> Iterator[Span]:
    """Time the block as stage ``name``; the span is recorded when the block ends (also on an error, with
    detail "failed" unless the block set one)."""
    span = Span(name, start=now(), model=model, detail=detail)
    try:
        yield span
    except BaseException:
        span.detail = span.detail or "failed"
        raise
    finally:
        span.seconds = now() - span.start
        with _LOCK:
            _SPANS.append(span)


def record(name: str, seconds: float, *, start: float | None = None, model: str = "", detail: str = "") -> Span:
    """Record a stage timed elsewhere (``start`` defaults to ``seconds`` before now)."""
    span = Span(name, seconds, now() - seconds if start is None else start, model, detail)
    with _LOCK:
        _SPANS.append(span)
    return span


def record_import() -> Span:
    """Record the interpreter's start and the imports, up to now (a command's entry point calls it once)."""
    with _LOCK:
        done = next((s for s in _SPANS if s.stage == "import"), None)
    return done or record("import", now(), start=0.0)


def spans() -> list[Span]:
    """Every span recorded in this process so far (and merged from others), in order of start."""
    with _LOCK:
        return sorted(_SPANS, key=lambda s: s.start)


def merge(others, *, offset: float = 0.0, process: str = "") -> None:
    """Add spans from another process (Span or ``to_dict`` form), shifted by ``offset`` seconds (that process's
    start on this one's scale: the difference of the two PROCESS_START values), labelled ``process``."""
    with _LOCK:
        for o in others:
            s = o if isinstance(o, Span) else Span.from_dict(o)
            _SPANS.append(Span(s.stage, s.seconds, s.start + offset, s.model, s.detail, s.process or process))


def reset() -> None:
    """Forget every span (a test, or a server process that starts a model again)."""
    with _LOCK:
        _SPANS.clear()


@dataclass
class Startup:
    """A command's start-up: its spans, and the wall time (after the process started) to its first result and
    to ready, where the command has them."""

    spans: list[Span] = field(default_factory=list)
    to_first_result_s: float | None = None
    to_ready_s: float | None = None

    @classmethod
    def from_dict(cls, data: dict) -> Startup:
        """The value ``to_dict`` gave (a report read back, or a worker's)."""
        spans = [Span.from_dict(s) for s in data.get("spans", ())]
        return cls(spans, data.get("to_first_result_s"), data.get("to_ready_s"))

    def stages(self) -> list[tuple[str, float, int, str]]:
        """(stage, summed seconds, count, details) per stage, in STAGES order; a stage of another process is
        its own row ("import (model process)")."""
        order = {name: i for i, name in enumerate(STAGES)}
        out: dict[str, list] = {}
        for s in sorted(self.spans, key=lambda s: (s.process, s.start)):
            name = f"{s.stage} ({s.process})" if s.process else s.stage
            row = out.setdefault(name, [0.0, 0, []])
            row[0] += s.seconds
            row[1] += 1
            if s.detail and s.detail not in row[2]:
                row[2].append(s.detail)
        ranked = sorted(out.items(), key=lambda kv: (order.get(kv[0].split(" (")[0], len(order)), kv[0]))
        return [(name, secs, n, ", ".join(details)) for name, (secs, n, details) in ranked]

    def to_dict(self) -> dict:
        """JSON-ready (schema onnxaccel.startup/1): per-stage sums, the spans, and the wall times."""
        return {"schema": SCHEMA,
                "to_first_result_s": _round(self.to_first_result_s), "to_ready_s": _round(self.to_ready_s),
                "stages": [{"stage": n, "seconds": round(s, 6), "count": c, "detail": d}
                           for n, s, c, d in self.stages()],
                "spans": [s.to_dict() for s in self.spans]}

    def line(self) -> str:
        """One sentence for a report: the wall time, then each stage's seconds (a stage that ran several times
        says how often)."""
        wall = next((f"{v:.2f} s {label}" for label, v in (("to ready", self.to_ready_s),
                                                          ("to the first result", self.to_first_result_s))
                     if v is not None), "")
        parts = [f"{name} {secs:.2f} s" + (f" (x{count})" if count > 1 else "")
                 for name, secs, count, _ in self.stages()]
        return f"start-up {wall}: " + ", ".join(parts) if wall else "start-up: " + ", ".join(parts)

    def lines(self, width: int = 78) -> list[str]:
        """The start-up block of a text report: one line per stage (sum, count, details), then the wall time."""
        out = []
        for name, secs, count, detail in self.stages():
            times = f" x{count}" if count > 1 else ""
            text = f"  {name:<16}{secs:8.2f} s{times:<5} {detail}".rstrip()
            out.append(text if len(text) <= width else text[:width - 1] + "…")
        for label, value in (("to first result", self.to_first_result_s), ("to ready", self.to_ready_s)):
            if value is not None:
                out.append(f"  {label:<16}{value:8.2f} s  (wall, from the process start)")
        return out


def summary(*, first_result: bool | str = False, ready: bool = False) -> Startup:
    """The spans so far, with the wall time to now as the time to the first result and/or to ready.
    ``first_result`` naming a stage: the first result came at the end of the earliest span of that stage."""
    t = now()
    recorded = spans()
    if isinstance(first_result, str):
        ends = [s.start + s.seconds for s in recorded if s.stage == first_result]
        first = min(ends) if ends else None
    else:
        first = t if first_result else None
    return Startup(recorded, first, t if ready else None)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
