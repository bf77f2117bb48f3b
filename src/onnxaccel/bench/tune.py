"""`tune`: find the fastest configuration of a model on a target that stays inside the accuracy gate.

The search is greedy, stage by stage (coordinate descent, as Triton model_analyzer's "quick" mode and Olive's
session-parameter tuning do), which keeps it to a handful of sessions per batch instead of the full product:

1. precision x IO binding (each precision one session, both feeding modes measured on it), plus the plain
   session fed numpy arrays (FP32, no options): the baseline and the accuracy reference;
2. then each stage of ``tune_space.stages_for(device)`` (layout, graph capture, algorithm search, threads)
   on top of the best so far of each precision (a beam: graph capture can reorder precisions at batch 1),
   kept only when it is faster.

A candidate counts only if it ran, passed the accuracy gate against the FP32 reference on the same device,
and (with a latency budget) its p99 latency is within the budget. Among those the highest throughput wins;
across several batch sizes that naturally prefers the largest batch that fits the budget. The winner and
the baseline are then measured again, longer and side by side ("confirm" cells), and the winner is written
as a configuration file (``bench.config``). Every candidate is a cell of an ordinary benchmark report,
written as it finishes, so nothing measured is lost and the search can be rendered like any sweep.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from onnxaccel.bench.accuracy import AccuracyGate, reference_target
from onnxaccel.bench.cells import CellResult, SweepCell
from onnxaccel.bench.config import (
    ConfigError,
    TunedConfig,
    file_sha256,
    load_config,
    save_config,
)
from onnxaccel.bench.host import utc_now
from onnxaccel.bench.report import BenchReport
from onnxaccel.bench.sweep import Sweep, SweepEvent, SweepSettings
from onnxaccel.bench.tune_space import precisions_for, stages_for
from onnxaccel.errors import OnnxAccelError
from onnxaccel.model import Model, load_model
from onnxaccel.target import GRAPH_OPTION, Target

__all__ = ["ConfigError", "TuneError", "TuneResult", "TuneSettings", "TunedConfig", "load_config", "save_config",
           "tune"]


#: Instance counts tune tries on GPUs by default.
GPU_INSTANCES = (2, 4)

#: Precisions whose best throughput is below this share of the leader drop out of the later stages.
BEAM_RATIO = 0.67


class TuneError(OnnxAccelError):
    """No configuration met the accuracy gate and the latency budget."""


@dataclass(frozen=True)
class TuneSettings:
    """What ``tune`` searches (batches, precisions, instances, threads) and how long and strictly it measures."""
    batches: tuple[int | None, ...] = (None,)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: None = the device's defaults (tune_space.DEFAULT_PRECISIONS), or the target string's own precision.
    precisions: tuple[str, ...] | None = None
    gate: AccuracyGate = field(default_factory=AccuracyGate)
    latency_budget_ms: float | None = None
    warmup: int = 10
    #: Seconds of timed calls per candidate, and for the final side-by-side confirmation.
    duration: float = 1.0
    confirm_duration: float = 3.0
    #: Stop starting new stages after this many seconds (the best so far wins).
    time_budget_s: float | None = None
    threads: tuple[int, ...] | None = None
    seed: int = 0
    inputs: tuple[str, ...] = ()
    strict: bool = False
    gpu_name: str | None = None
    #: Instance counts tried on the leader after the option stages: None = (2, 4) on GPUs and none on CPUs
    #: (where sessions would share the same cores); empty = none.
    instances: tuple[int, ...] | None = None
    #: --shape-buckets text recorded in the configuration (bench and batch --config use it); not searched.
    shape_buckets: str | None = None

    def sweep(self, duration: float) -> SweepSettings:
        """Sweep settings that time each candidate for ``duration`` seconds."""
        return SweepSettings(warmup=self.warmup, runs=None, duration=duration, gate=self.gate, seed=self.seed,
                             inputs=self.inputs, strict=self.strict, gpu_name=self.gpu_name)

    def to_dict(self) -> dict:
        """JSON-ready form of the settings, stored in the report's ``tune`` field."""
        return {"batches": list(self.batches), "shapes": {k: list(v) for k, v in self.shapes.items()},
                "precisions": list(self.precisions) if self.precisions else None, "accuracy_gate": self.gate.to_dict(),
                "latency_budget_ms": self.latency_budget_ms, "warmup": self.warmup, "duration_s": self.duration,
                "confirm_duration_s": self.confirm_duration, "time_budget_s": self.time_budget_s,
                "threads": list(self.threads) if self.threads else None, "seed": self.seed,
                "instances": list(self.instances) if self.instances is not None else None}


@dataclass
class TuneResult:
    """The best configuration found, the plain-session baseline it was measured against, and every candidate."""
    model: str
    target: str
    best: CellResult
    baseline: CellResult | None
    config: TunedConfig
    candidates: list[dict]
    notes: list[str]
    seconds: float

    @property
    def speedup(self) -> float | None:
        """Throughput of the best cell over the baseline's, or None when the baseline did not run."""
        if self.baseline is None or not self.baseline.ok or not self.baseline.throughput:
            return None
        return (self.best.throughput or 0.0) / self.baseline.throughput

    def summary(self) -> list[str]:
        """Human-readable lines: the best cell, the speed-up and the tuning notes."""
        lines = [f"best: {self.best.id}: {self.best.throughput:,.1f} items/s, p50 {self.best.latency.p50:.3f} ms, "
                 f"p99 {self.best.latency.p99:.3f} ms"]
        if self.speedup is not None:
            lines.append(f"{self.speedup:.2f}x the throughput of the plain session fed numpy arrays "
                         f"({self.baseline.id}: {self.baseline.throughput:,.1f} items/s), measured side by side")
        return lines + self.notes

    def to_dict(self) -> dict:
        """JSON-ready form of the result (best and baseline in brief, the saved config)."""
        def brief(cell: CellResult | None) -> dict | None:
            if cell is None or not cell.ok:
                return None
            return {"id": cell.id, "target": str(cell.cell.effective_target), "batch": cell.batch,
                    "iobinding": cell.cell.iobinding, "throughput": cell.throughput, "p50_ms": cell.latency.p50,
                    "p99_ms": cell.latency.p99}

        return {"model": self.model, "target": self.target, "best": brief(self.best), "baseline": brief(self.baseline),
                "speedup_vs_plain": self.speedup, "config": self.config.to_dict(), "candidates": self.candidates,
                "notes": self.notes, "seconds": self.seconds, "summary": self.summary()}


def tune(
    source: str | Model,
    target: Target,
    settings: TuneSettings,
    *,
    report_paths: Sequence[Path] = (),
    report: BenchReport | None = None,
    on_event: Callable[[SweepEvent], None] | None = None,
    sampler_factory=None,
    command: str | None = None,
) -> TuneResult:
    """Search for the fastest configuration of ``source`` on ``target`` within the accuracy gate.

    Stages are tried one at a time, each kept only when it beats the best so far, then the winner is
    re-measured side by side with the plain session; the reports are written as cells finish."""
    return _Tuner(source, target, settings, report_paths, report, on_event, sampler_factory, command).run()


class _Tuner:
    def __init__(self, source, target, settings, paths, report, on_event, sampler_factory, command):
        self.model = source if isinstance(source, Model) else load_model(source)
        self.target, self.settings, self.command = target, settings, command
        self.emit = on_event or (lambda event: None)
        self.sweep = Sweep(self.model, settings.sweep(settings.duration), paths, report=report, on_event=self.emit,
                           sampler_factory=sampler_factory, command="tune")
        self.sweep.report.settings["tune"] = settings.to_dict()
        self.paths, self.sampler_factory = list(paths), sampler_factory
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self.started = time.perf_counter()

    # -- scoring ---------------------------------------------------------------------------------------

    def verdict(self, result: CellResult) -> str:
        if not result.ok:
            return "failed: " + str((result.error or {}).get("message", ""))[:160]
        accuracy = result.accuracy or {}
        if accuracy.get("passed") is None:
            return "accuracy unknown: " + str((accuracy.get("error") or {}).get("message", ""))[:160]
        if not accuracy["passed"]:
            return f"outside the accuracy gate (max |error| {accuracy.get('max_abs')})"
        budget = self.settings.latency_budget_ms
        if budget is not None and result.latency.p99 > budget:
            return f"over the latency budget (p99 {result.latency.p99:.3f} ms > {budget:g} ms)"
        return "valid"

    def score(self, result: CellResult | None) -> float | None:
        return result.throughput if result is not None and self.verdict(result) == "valid" else None

    def better(self, a: CellResult | None, b: CellResult | None) -> CellResult | None:
        sa, sb = self.score(a), self.score(b)
        if sb is None:
            return a if sa is not None else None
        return b if sa is None or sb > sa else a

    def evaluate(self, cells: list[SweepCell], stage: str) -> list[CellResult]:
        self.emit(SweepEvent("stage", message=stage))
        results = self.sweep.run(cells)
        for result in results:
            self.rows.append({"stage": stage, "id": result.id, "status": result.status,
                              "throughput": result.throughput, "p50_ms": result.latency.p50 if result.latency else None,
                              "p99_ms": result.latency.p99 if result.latency else None,
                              "verdict": self.verdict(result)})
        return results

    def out_of_time(self) -> bool:
        budget = self.settings.time_budget_s
        return budget is not None and time.perf_counter() - self.started > budget

    # -- search ----------------------------------------------------------------------------------------

    def run(self) -> TuneResult:
        best: CellResult | None = None
        for batch in self.settings.batches:
            best = self.better(best, self.search_batch(batch))
        if best is None:
            self.sweep.report.tune = {"best": None, "candidates": self.rows, "notes": self.notes}
            self.sweep.write()
            raise self.no_config_error()
        confirmed_best, baseline = self.confirm(best)
        result = TuneResult(self.model.source, str(self.target), confirmed_best, baseline,
                            self.make_config(confirmed_best, baseline), self.rows, self.notes,
                            time.perf_counter() - self.started)
        self.sweep.report.tune = result.to_dict()
        self.sweep.report.complete = True
        self.sweep.write()
        return result

    def search_batch(self, batch: int | None) -> CellResult | None:
        shapes = tuple(sorted(self.settings.shapes.items()))
        precisions = self.settings.precisions or (
            (self.target.precision,) if self.target.precision != "fp32" else precisions_for(self.target))
        plain = SweepCell(reference_target(self.target), batch, shapes, iobinding=False)
        cells = [plain] + [SweepCell(self.target.with_precision(p), batch, shapes, iobinding=io)
                           for p in precisions for io in (True, False)]
        # The beam: the best valid candidate of each precision. Precision alone can mislead (at batch 1 a GPU
        # is launch-bound and FP32 ~ FP16 until graph capture removes the launches), so later stages are
        # tried on every precision still within BEAM_RATIO of the best.
        beam: dict[str, CellResult] = {}
        for result in self.evaluate(list(dict.fromkeys(cells)), f"batch {batch or 'default'}: precision x IO binding"):
            precision = result.cell.effective_target.precision
            beam[precision] = self.better(beam.get(precision), result)
        beam = {p: r for p, r in beam.items() if r is not None}
        if not beam:
            self.notes.append(f"batch {batch or 'default'}: no precision ran inside the gate")
            return None
        for stage in stages_for(self.target, threads=self.settings.threads):
            if self.out_of_time():
                self.notes.append(f"time budget reached: stage '{stage.name}' and later ones not tried")
                break
            top = max(self.score(r) for r in beam.values())
            beam = {p: r for p, r in beam.items() if self.score(r) >= BEAM_RATIO * top}
            cells = []
            for member in beam.values():
                base = member.cell.effective_target
                io = True if stage.needs_iobinding else member.cell.iobinding
                cells += [SweepCell(base.with_options(variant), batch, shapes, iobinding=io)
                          for variant in stage.variants
                          if any(base.option_dict.get(k) != v for k, v in variant.items())]
            for result in self.evaluate(cells, f"batch {batch or 'default'}: {stage.name}"):
                precision = result.cell.effective_target.precision
                beam[precision] = self.better(beam[precision], result)
        best = None
        for member in beam.values():
            best = self.better(best, member)
        counts = self.settings.instances if self.settings.instances is not None else (
            GPU_INSTANCES if self.target.is_gpu else ())
        if best is not None and counts:
            if self.out_of_time():
                self.notes.append("time budget reached: the instances stage was not tried")
            else:
                # Several sessions side by side, each on its own stream (and its own captured graph): a GPU
                # that one small-batch stream leaves mostly idle runs them in parallel. Per-call latency
                # rises, so a latency budget still rules through its p99.
                cells = [dataclasses.replace(best.cell, instances=n, tag="") for n in counts]
                if best.cell.uses_graph:
                    # Also without graph capture: launch-bound sessions in parallel threads (ORT releases the
                    # GIL in Run) can outrun one replayed graph, and they need no capture at all.
                    target = best.cell.effective_target
                    plain = target.without_options(GRAPH_OPTION[target.device])
                    cells += [dataclasses.replace(best.cell, target=str(plain), graph=False, instances=n, tag="")
                              for n in counts]
                for result in self.evaluate(cells, f"batch {batch or 'default'}: instances (sessions side by side)"):
                    best = self.better(best, result)
        return best

    def confirm(self, best: CellResult) -> tuple[CellResult, CellResult | None]:
        """Measure the winner and the plain baseline again, longer, one after the other."""
        confirm = Sweep(self.model, self.settings.sweep(self.settings.confirm_duration), self.paths,
                        report=self.sweep.report, on_event=self.emit, sampler_factory=self.sampler_factory,
                        note_changed_settings=False, command="tune")
        plain = SweepCell(reference_target(self.target), best.cell.batch, best.cell.shapes, iobinding=False,
                          tag="confirm")
        winner = dataclasses.replace(best.cell, tag="confirm")
        self.emit(SweepEvent("stage", message="confirm: winner and plain baseline side by side"))
        results = {r.id: r for r in confirm.run([plain, winner] if plain.id != winner.id else [winner])}
        got_best, got_base = results.get(winner.id), results.get(plain.id)
        if got_best is None or self.verdict(got_best) != "valid":
            self.notes.append("the confirmation run of the winner did not pass "
                              f"({self.verdict(got_best) if got_best else 'missing'}); figures are from the search")
            got_best = best
        return got_best, got_base if got_base is not None and got_base.ok else None

    def make_config(self, best: CellResult, baseline: CellResult | None) -> TunedConfig:
        telemetry = best.telemetry or {}
        speedup = (best.throughput / baseline.throughput) if baseline is not None and baseline.throughput else None
        env = self.sweep.report.environment
        return TunedConfig(
            model=self.model.source, target=best.cell.effective_target, batch=best.cell.batch,
            shapes=dict(self.settings.shapes), input_shapes={k: tuple(v) for k, v in (best.input_shapes or {}).items()},
            iobinding=best.cell.iobinding, concurrency=best.cell.concurrency, instances=best.cell.instances,
            model_sha256=file_sha256(self.model.path), shape_buckets=self.settings.shape_buckets,
            measured={"p50_ms": best.latency.p50, "p99_ms": best.latency.p99,
                      "throughput_items_per_s": best.throughput, "speedup_vs_plain": speedup,
                      "accuracy_max_abs": (best.accuracy or {}).get("max_abs"),
                      "accuracy_reference": (best.accuracy or {}).get("reference")},
            objective={"goal": "latency-budget" if self.settings.latency_budget_ms else "throughput",
                       "latency_budget_ms": self.settings.latency_budget_ms,
                       "accuracy_gate": self.settings.gate.to_dict()},
            provenance={"created": utc_now(), "onnxaccel": env.get("onnxaccel"), "onnxruntime": env.get("onnxruntime"),
                        "device": telemetry.get("name") or (env.get("cpu") if best.cell.effective_target.device == "cpu"
                                                            else None),
                        "command": self.command, "candidates": len(self.rows),
                        "report": str(self.paths[0]) if self.paths else None},
        )

    def no_config_error(self) -> TuneError:
        failed = [r for r in self.rows if r["status"] != "ok"]
        reasons = sorted({r["verdict"].split(":")[0].split(" (")[0] for r in self.rows})
        budget = self.settings.latency_budget_ms
        fastest = min((r["p99_ms"] for r in self.rows if r["p99_ms"] is not None), default=None)
        hint = "See the report for every candidate and why it was rejected."
        if budget is not None and fastest is not None and fastest > budget:
            hint = (f"The lowest p99 latency found was {fastest:.3f} ms: raise --latency-budget, or try smaller "
                    "--batch values.")
        elif failed and len(failed) == len(self.rows):
            hint = "Every candidate failed to run; the first error: " + failed[0]["verdict"]
        return TuneError(f"No configuration of {self.model.source} on {self.target} met the criteria "
                         f"({len(self.rows)} candidates: {', '.join(reasons)}).", hint)

