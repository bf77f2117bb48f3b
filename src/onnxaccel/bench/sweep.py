"""Run sweep cells: one session per (target, batch, shapes), every cell measured, judged and written.

A cell that fails (a provider that does not load, an unsupported op, out of memory, a shape the model
refuses) is recorded with its error, message and hint, and the sweep goes on. After every cell the report
files are rewritten atomically, so an interrupted sweep keeps every finished cell, and a resumed one
(``skip_finished``) measures only the rest. The library never prints: progress goes to ``on_event``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from onnxaccel import startup
from onnxaccel.bench import accuracy as acc
from onnxaccel.bench.cells import CellResult, SweepCell, order_for_execution
from onnxaccel.bench.concurrency import measure_concurrent
from onnxaccel.bench.device_metrics import DeviceMonitor
from onnxaccel.bench.gpu_specs import lookup
from onnxaccel.bench.host import environment, host_memory, utc_now
from onnxaccel.bench.report import BenchReport, ReportError, write_reports
from onnxaccel.bench.roofline import ModelCost, model_cost, roofline
from onnxaccel.bench.stats import histogram, keep_samples
from onnxaccel.bench.timing import measure_call, measure_transfers
from onnxaccel.errors import InferenceError, OnnxAccelError, ShapeError
from onnxaccel.model import Model, load_model
from onnxaccel.pipeline import Prepared, explain_failure, prepare


@dataclass(frozen=True)
class SweepSettings:
    """How every cell of a sweep is measured: warm-up, runs or duration, grouping, inputs, accuracy gate."""
    warmup: int = 10
    runs: int | None = 100
    duration: float | None = None
    #: Consecutive calls per timed sample; None = automatic (grouped below 100 us per call).
    calls_per_sample: int | None = None
    gate: acc.AccuracyGate = field(default_factory=acc.AccuracyGate)
    seed: int = 0
    inputs: tuple[str, ...] = ()
    #: --value-range: {input name or "*": (low, high)} for synthesized inputs.
    value_ranges: tuple[tuple[str, tuple[float, float]], ...] = ()
    strict: bool = False
    #: Sample GPU utilization, memory and power during GPU cells (system.telemetry.GpuSampler).
    telemetry: bool = True
    telemetry_interval: float = 0.1
    #: Device name for the peak-spec lookup when the sampler cannot tell (e.g. no NVML installed).
    gpu_name: str | None = None
    transfers: bool = True

    def to_dict(self) -> dict:
        """The settings as JSON-ready values, as the report records them."""
        return {"warmup": self.warmup, "runs": self.runs, "duration_s": self.duration,
                "calls_per_sample": self.calls_per_sample or "auto", "accuracy_gate": self.gate.to_dict(),
                "seed": self.seed, "inputs": list(self.inputs), "strict": self.strict,
                "value_ranges": {name: list(r) for name, r in self.value_ranges},
                "telemetry": self.telemetry, "telemetry_interval_s": self.telemetry_interval,
                "gpu_name": self.gpu_name}


@dataclass(frozen=True)
class SweepEvent:
    """``kind``: "start" (total), "cell-start", "cell-progress" (done/runs), "cell-done" (result),
    "cell-skip" (finished in an earlier run), "stage" (tune: ``message`` says which)."""

    kind: str
    index: int = 0
    total: int = 0
    cell: SweepCell | None = None
    result: CellResult | None = None
    done: int = 0
    runs: int = 0
    message: str = ""


class Sweep:
    """Runs cells for one model into one report (new, or loaded to resume)."""

    def __init__(self, source: str | Model, settings: SweepSettings, report_paths: Sequence[Path] = (), *,
                 report: BenchReport | None = None, on_event: Callable[[SweepEvent], None] | None = None,
                 sampler_factory=None, note_changed_settings: bool = True, command: str = "bench"):
        #: Who asks for the plans (plan.py COMMANDS): "bench", or "tune" when the tuner drives the sweep.
        self.command = command
        self.model = source if isinstance(source, Model) else load_model(source)
        self.settings = settings
        self.paths = list(report_paths)
        self.on_event = on_event or (lambda event: None)
        self.sampler_factory = sampler_factory
        self.refs = acc.ReferenceStore()
        self._costs: dict[tuple, ModelCost | None] = {}
        model_info = {"source": self.model.source, "name": self.model.name, "path": str(self.model.path),
                      "inputs": [s.to_dict() for s in self.model.inputs],
                      "outputs": [s.to_dict() for s in self.model.outputs]}
        if report is None:
            report = BenchReport(model=model_info, environment=environment(), settings=settings.to_dict())
        elif report.model.get("source") != self.model.source:
            raise ReportError(f"The report to resume is for {report.model.get('source')!r}, not {self.model.source!r}.",
                              "Resume with the same model, or write to another --report file.")
        elif note_changed_settings:
            now = settings.to_dict()
            changed = sorted(k for k, v in now.items() if report.settings.get(k, v) != v)
            if changed:
                report.notes.append(f"resumed at {utc_now()} with different settings ({', '.join(changed)}); cells "
                                    "measured before keep the earlier ones")
                report.settings.update(now)
        self.report = report

    # -- driving ---------------------------------------------------------------------------------------

    def run(self, cells: Sequence[SweepCell], *, skip_finished: bool = True, retry_failed: bool = False
            ) -> list[CellResult]:
        """Measure ``cells`` (those already in the report are skipped unless asked); return their results
        in the order given."""
        todo, index = [], 0
        for cell in cells:
            done = self.report.cell(cell.id)
            if done is not None and skip_finished and (done.ok or not retry_failed):
                self.on_event(SweepEvent("cell-skip", cell=cell, result=done))
            else:
                todo.append(cell)
        self.on_event(SweepEvent("start", total=len(todo)))
        self.write()
        for group in order_for_execution(todo):
            for result in self._run_group(group, index, len(todo)):
                self.report.add(result)
                if self.report.startup is None:  # this process's start-up, to its first measured result
                    self.report.startup = startup.summary(first_result="first run").to_dict()
                self.write()
                self.on_event(SweepEvent("cell-done", index=index, total=len(todo), cell=result.cell, result=result))
                index += 1
        return [self.report.cell(c.id) for c in cells if self.report.cell(c.id) is not None]

    def write(self) -> None:
        """Write the sweep's report to every requested path (JSON, text, HTML, by suffix)."""
        write_reports(self.report, self.paths)

    # -- one session -----------------------------------------------------------------------------------

    def _run_group(self, group: list[SweepCell], index: int, total: int):
        first = group[0]
        target = first.effective_target
        monitor = DeviceMonitor(target if self.settings.telemetry else None, self.settings.telemetry_interval,
                                self.sampler_factory)
        before = monitor.snapshot()
        self.on_event(SweepEvent("cell-start", index=index, total=total, cell=first))
        started, t0 = utc_now(), time.perf_counter()
        try:
            check_batch(self.model, first.batch)
            prepared = prepare(self.model, target, inputs=self.settings.inputs, shapes=first.shape_dict,
                               batch=first.batch, strict=self.settings.strict, seed=self.settings.seed,
                               value_ranges=dict(self.settings.value_ranges), command=self.command)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            error = _error_dict(exc, "prepare")
            for cell in group:
                yield CellResult(cell, "failed", started, time.perf_counter() - t0, error=error)
            return
        if prepared.plan is not None:
            self.report.add_plan(prepared.plan.to_dict())
        session = {"prepare_s": time.perf_counter() - t0, "create_s": prepared.runner.compile_seconds,
                   "first_inference_ms": None, "providers": prepared.runner.providers,
                   "placement": prepared.runner.placement.summary(), "warnings": list(prepared.warnings),
                   "device_memory_before_bytes": _mean(before, "memory_used_bytes")}
        try:
            for offset, cell in enumerate(group):
                if offset:
                    self.on_event(SweepEvent("cell-start", index=index + offset, total=total, cell=cell))
                yield self._run_cell(cell, prepared, session, monitor, index + offset, total)
        finally:
            prepared.close()

    # -- one cell --------------------------------------------------------------------------------------

    def _run_cell(self, cell: SweepCell, prepared: Prepared, session: dict, monitor: DeviceMonitor,
                  index: int, total: int) -> CellResult:
        s = self.settings
        started, t0 = utc_now(), time.perf_counter()
        shapes = {k: list(v) for k, v in prepared.model.input_shapes.items()}
        batch = next(iter(prepared.model.input_shapes.values()))[0] if prepared.model.input_shapes else 1
        runner, feeds = prepared.runner, prepared.feeds

        def progress(n: int, runs: int) -> None:
            self.on_event(SweepEvent("cell-progress", index=index, total=total, cell=cell, done=n, runs=runs))

        try:
            bound = runner.bind(feeds) if cell.iobinding and not cell.parallel else None
            extra = self._instances(cell, prepared)
            monitor.start()
            try:
                if cell.parallel:
                    timing = measure_concurrent([runner, *extra] if extra else runner, feeds,
                                                concurrency=cell.concurrency, batch=batch, warmup=s.warmup,
                                                runs=s.runs, duration=s.duration, iobinding=cell.iobinding,
                                                progress=progress)
                else:
                    call = bound.run if bound is not None else functools.partial(runner.run, feeds)
                    timing = measure_call(call, batch=batch, warmup=s.warmup, runs=s.runs, duration=s.duration,
                                          calls_per_sample=s.calls_per_sample, iobinding=cell.iobinding,
                                          progress=progress)
            finally:
                telemetry = monitor.stop()
                for other in extra:
                    other.close()
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if isinstance(exc, InferenceError):  # name the synthesized inputs, as run/compare/profile do
                exc = explain_failure(exc, prepared.origins)
            return CellResult(cell, "failed", started, time.perf_counter() - t0, error=_error_dict(exc, "measure"),
                              input_shapes=shapes, session=dict(session))
        if session["first_inference_ms"] is None:
            session["first_inference_ms"] = timing.first_run_ms
        warnings = []
        if timing.latency.unstable:
            warnings.append(f"unstable: coefficient of variation {timing.latency.cv:.0%} (> 10%); the machine may "
                            "be busy or clocks changing; use more --runs or --duration.")
        # The timing stands from here on: outputs and copies that fail cost only their own fields.
        accuracy = transfer = None
        try:
            if bound is not None:
                outputs = bound.outputs()
            elif cell.parallel:  # the first timed call site's (its binding replays its own captured graph)
                outputs = timing.outputs()
            else:
                outputs = runner.run(feeds)
            accuracy = self._accuracy(cell, prepared, outputs)
        except Exception as exc:  # noqa: BLE001
            accuracy = {"reference": None, "passed": None, "error": _error_dict(exc, "outputs")}
        if bound is not None and s.transfers:
            try:
                transfer = measure_transfers(bound, feeds, timing.latency.p50).to_dict()
            except Exception as exc:  # noqa: BLE001
                transfer = {"method": "explicit-copy", "error": _error_dict(exc, "transfers")}
        timing_dict = timing.to_dict()
        timing_dict["throughput_basis"] = "wall" if cell.parallel else "median"
        for key in ("batch", "iobinding", "latency"):
            timing_dict.pop(key)
        return CellResult(
            cell, "ok", started, time.perf_counter() - t0, input_shapes=shapes, latency=timing.latency,
            timing=timing_dict, session=dict(session), transfer=transfer, telemetry=telemetry,
            memory=self._memory(session, telemetry), roofline=self._roofline(cell, prepared, timing, telemetry),
            accuracy=accuracy, histogram=histogram(timing.samples_ms),
            samples_ms=keep_samples(timing.samples_ms), warnings=warnings,
        )

    def _instances(self, cell: SweepCell, prepared: Prepared) -> list:
        """The further sessions of an ``instances`` cell (the group's session is the first), closed again if
        one of them cannot be built. They are compiled from the group's converted model: nothing is bound,
        converted or drawn again."""
        extra = []
        try:
            for _ in range(cell.instances - 1):
                extra.append(prepared.new_runner())
        except BaseException:
            for runner in extra:
                runner.close()
            raise
        return extra

    def _memory(self, session: dict, telemetry: dict | None) -> dict:
        memory = host_memory()
        peak = telemetry["memory_used_bytes"]["peak"] if telemetry and telemetry.get("available") else None
        before = session.get("device_memory_before_bytes")
        memory["device_peak_bytes"] = peak
        memory["device_delta_bytes"] = peak - before if peak is not None and before is not None else None
        return memory

    def _roofline(self, cell: SweepCell, prepared: Prepared, timing, telemetry: dict | None) -> dict | None:
        key = tuple(sorted(prepared.model.input_shapes.items()))
        if key not in self._costs:
            try:
                self._costs[key] = model_cost(prepared.model)
            except Exception:  # noqa: BLE001 - a model shape inference cannot read loses only the roofline
                self._costs[key] = None
        cost = self._costs[key]
        if cost is None or not cost.flops:
            return None
        per_inference = (timing.latency.p50 / 1e3 if not cell.parallel
                         else timing.wall_seconds / max(timing.calls, 1))
        name = self.settings.gpu_name or (telemetry or {}).get("name")
        target = cell.effective_target
        spec = lookup(name) if target.is_gpu else None
        return roofline(cost, seconds_per_inference=per_inference, precision=target.precision, device=target.device,
                        options=target.option_dict, spec=spec).to_dict()

    def _accuracy(self, cell: SweepCell, prepared: Prepared, outputs) -> dict | None:
        target = cell.effective_target
        shapes = prepared.model.input_shapes
        if acc.is_reference(target):
            self.refs.put(target, shapes, outputs)
            return {"reference": "self", "passed": True}
        try:
            reference, label = self.refs.get(target, shapes, lambda ref: self._reference_outputs(ref, prepared))
            return acc.check(reference, outputs, precision=target.precision, gate=self.settings.gate, label=label)
        except Exception as exc:  # noqa: BLE001 - the cell's timing stands; the accuracy says why it is missing
            return {"reference": None, "passed": None, "error": _error_dict(exc, "accuracy")}

    def _reference_outputs(self, ref_target, prepared: Prepared):
        """The reference target's outputs on the cell's own bound model and feeds (compiled for it, run once)."""
        reference = prepared.for_target(ref_target)
        try:
            return reference.runner.run(reference.feeds)
        finally:
            reference.close()


def check_batch(model: Model, batch: int | None) -> None:
    """A batch size the model cannot take is an error, not a silent run at another batch: ``Model.bind``
    applies --batch only to inputs whose first axis is free."""
    if batch is None:
        return
    first_axes = [s.shape[0] if s.shape else None for s in model.inputs]
    if any(not isinstance(d, int) for d in first_axes) or batch in first_axes:
        return
    fixed = ", ".join(f"{s.name} {s.shape_text()}" for s in model.inputs)
    raise ShapeError(f"The model's inputs have a fixed first axis ({fixed}); batch {batch} cannot be applied.",
                     "Sweep only the batch sizes the model was exported with, or re-export it with a dynamic "
                     "batch axis (torch.onnx.export(..., dynamic_axes={'x': {0: 'batch'}})).")


def _mean(reading: dict | None, metric: str):
    if not reading or not reading.get("available"):
        return None
    return reading[metric]["mean"]


def _error_dict(exc: BaseException, stage: str) -> dict:
    if isinstance(exc, OnnxAccelError):
        out = exc.to_dict()
        if out.get("details") and len(out["details"]) > 4000:
            out["details"] = out["details"][:4000] + " ..."
    elif isinstance(exc, MemoryError):
        out = {"error": "MemoryError", "message": "The host ran out of memory.",
               "hint": "Use a smaller --batch, or close other programs.", "details": None}
    else:
        out = {"error": type(exc).__name__, "message": f"{type(exc).__name__}: {exc}",
               "hint": "Unexpected error in this cell; rerun it alone with --debug and report the traceback.",
               "details": None}
    out["stage"] = stage
    return out
