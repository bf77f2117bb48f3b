"""`onnxaccel bench`: latency, throughput, accuracy and hardware efficiency of a model, one cell or a sweep."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from onnxaccel import providers, startup
from onnxaccel.cli.args_data import GPU, AccuracyArgs, InputArgs, OutputArgs, ReportArgs, RunnerArgs, TimingArgs
from onnxaccel.cli.args_model import BATCHES, ConfigArgs, PrecisionsArgs, ShapeArgs, SourceArg, TargetArgs
from onnxaccel.cli.common import console, err_console, handle_errors, note, warn
from onnxaccel.cli.compose import Built, Group, composed, option
from onnxaccel.cli.groups import modes, warn_if_not_tuned
from onnxaccel.cli.tables import columns, new_table, number_column, si, text_column
from onnxaccel.engines import prewarm

#: The order of the options in --help.
ORDER = ("model target precision ep_option shape batch iobinding no_iobinding graph warmup runs duration "
         "calls_per_sample concurrency instances report baseline noise fail_on_regression resume retry_failed "
         "max_error atol rtol inputs seed value_range gpu telemetry config shape_buckets shape_sweep strict as_json")


class SweepArgs(Group):
    """What else a sweep varies and records: --graph (on|off|both, checked), --gpu, --telemetry, --shape-sweep,
    and against an earlier report --baseline, --noise, --fail-on-regression, --retry-failed."""

    PARAMS = (
        option("graph", str, "off", "--graph", help=f"Graph capture ({' / '.join(providers.graph_options())}): "
               "on, off or both."),
        option("baseline", str | None, None, help="Compare with an earlier JSON report: regressions and gains "
               "beyond noise."),
        option("noise", float, 0.05, help="Smallest relative change counted against --baseline."),
        option("fail_on_regression", bool, False, "--fail-on-regression", help="Exit 1 when --baseline finds a "
               "regression (for CI)."),
        option("retry_failed", bool, False, "--retry-failed", help="With --resume, run failed cells again."),
        GPU,
        option("telemetry", bool, True, "--telemetry/--no-telemetry", help="Sample GPU utilization, memory and "
               "power during GPU cells (every 0.1 s, in a background thread)."),
        option("shape_sweep", bool, False, "--shape-sweep", help="With --shape-buckets: compile, warm-up and "
               "latency of every bucket, each fed at its size."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        return SimpleNamespace(**{**vars(v), "graph": modes(v.graph, "--graph")})


def register(app: typer.Typer) -> None:
    """Add `bench` to the `onnxaccel` app."""
    app.command("bench", help="Measure a model: session creation and first inference apart; latency min/mean/"
                "p50/p90/p95/p99/p99.9/max; throughput; host/device copy split; GPU utilization, memory, power; "
                "TFLOP/s against the device's peak; accuracy of FP16/INT8 against FP32. Sweep targets, precisions, "
                "batches, IO binding and graph capture; write JSON/CSV/Markdown/HTML; compare with a baseline; "
                "--resume an interrupted sweep.")(bench_command)


@handle_errors
@composed(
    SourceArg("An .onnx file or zoo:NAME (default: the --config's model).", optional=True),
    TargetArgs(kind="many", config=True, precision=None, help="Where to run (repeat for several): auto, cpu, "
               "cuda[:ID], migraphx[:ID], rocm, tensorrt; optionally /PRECISION and ?KEY=VALUE options, e.g. "
               f"{providers.get('cuda').example}. Default: auto, or the --config's target."),
    PrecisionsArgs("Comma-separated precisions to sweep, e.g. fp32,fp16,int8 (overrides the target's)."),
    ShapeArgs(batch=BATCHES, buckets="Pad inputs to the smallest of these sizes that fits, one session per bucket "
              "on targets that compile per shape: DIM=SIZES (sequence=32,64,128,256), DIM,DIM=SIZES "
              "(height,width=320,480,640 or 320x480,...), dims by name or INPUT:AXIS (x:2,x:3=640,960). Times the "
              "--shape/--input size through its bucket."),
    RunnerArgs(iobinding="modes"), TimingArgs(), SweepArgs(),
    ReportArgs(resume="Skip the cells already in the --report FILE.json."), AccuracyArgs(), InputArgs(),
    ConfigArgs("model, target, batch, shapes, shape buckets, IO binding and instance count"), OutputArgs(),
    order=ORDER,
)
def bench_command(model, targets, precisions, shapes, runner, timing, sweep, reports, gate, given, tuned,
                  as_json) -> None:
    """Measure MODEL over the sweep's cells; options a --config can set resolve as flag > config > default."""
    prewarm.start(targets[0] if targets else None)  # a GPU provider's libraries load while the command starts
    with startup.stage("import", detail="the command's modules (onnx, numpy)"):  # deferred from start-up
        from onnxaccel.bench.cells import grid
        from onnxaccel.bench.report import clean

    if shapes.buckets or sweep.shape_sweep:
        _bench_buckets(model, targets, precisions, shapes, timing, given, runner.strict, sweep.shape_sweep, as_json)
        return
    cells, skipped = grid([str(t) for t in targets], precisions=list(precisions.names) or [None],
                          batches=list(shapes.batches), shapes=shapes.shapes, iobinding=runner.iobinding,
                          graph=sweep.graph, concurrency=list(timing.concurrency), instances=list(timing.instances))
    report, comparison = _sweep(model, cells, skipped, runner, timing, sweep, reports, gate, given, tuned, as_json)
    if as_json:
        sys.stdout.write(json.dumps(clean(report.to_dict()), indent=2) + "\n")
    else:
        render_report(report)
        if not reports.paths and len(cells) > 1:
            note("--report out.json keeps results as each cell finishes and lets --resume continue a sweep.")
    if not report.ok_cells and report.cells:
        if not as_json:  # each distinct error and its hint are printed once, above (_render_notes)
            reasons = {(c.error or {}).get("message") for c in report.failed_cells}
            err_console.print(f"[bold red]error:[/] every cell failed ({len(report.cells)}), for the "
                              f"reason{'s' if len(reasons) > 1 else ''} above.", highlight=False)
        raise typer.Exit(1)
    if sweep.fail_on_regression and comparison is not None and comparison.regressions:
        raise typer.Exit(1)


def _sweep(model, cells, skipped, runner, timing, sweep, reports, gate, given, tuned, as_json):
    """Run the sweep's cells (resuming from the earlier report) and compare with --baseline: the report and
    the comparison (None without a baseline)."""
    from onnxaccel.bench.baseline import compare_reports
    from onnxaccel.bench.report import load_report

    with startup.stage("import", detail="the command's modules (onnx, numpy)"):
        from onnxaccel.bench.sweep import Sweep, SweepSettings  # heavy: loaded per command (keeps --help fast)

    settings = SweepSettings(warmup=timing.warmup, runs=timing.runs, duration=timing.duration,
                             calls_per_sample=timing.calls_per_sample, gate=gate, seed=given.seed,
                             inputs=given.items, value_ranges=tuple(given.value_ranges.items()),
                             strict=runner.strict, gpu_name=sweep.gpu, telemetry=sweep.telemetry)
    previous = reports.previous()
    if reports.resume and previous is None:
        note(f"{reports.json_path} does not exist yet: nothing to resume, starting a new sweep.")
    old = load_report(sweep.baseline) if sweep.baseline else None
    with SweepProgress(disable=as_json, errors_below=True) as progress:
        run = Sweep(model, settings, list(reports.paths), report=previous, on_event=progress.event)
        warn_if_not_tuned(tuned, run.model.path)
        run.report.skipped = [s.to_dict() for s in skipped]
        run.run(cells, retry_failed=sweep.retry_failed)
    report = run.report
    report.complete = all(report.cell(c.id) is not None for c in cells)
    comparison = None
    if old is not None:
        comparison = compare_reports(report, old, baseline_name=str(sweep.baseline), threshold=sweep.noise)
        report.baseline = comparison.to_dict()
    run.write()
    return report, comparison


def _bench_buckets(model: str, targets, precisions, shapes, timing, given, strict: bool, sweep: bool,
                   as_json: bool) -> None:
    """`bench --shape-buckets [--shape-sweep]`: one target, one batch, measured per bucket (bench/bucket_sweep.py)."""
    import dataclasses

    from onnxaccel.bench.bucket_sweep import bench_buckets, bucket_table_rows
    from onnxaccel.bench.report import clean
    from onnxaccel.engines.buckets import ShapeBuckets
    from onnxaccel.errors import UsageError

    if not shapes.buckets:
        raise UsageError("--shape-sweep needs --shape-buckets.",
                         "e.g. --shape-buckets sequence=32,64,128,256 --shape-sweep")
    if len(targets) != 1 or len(shapes.batches) != 1 or (precisions.text and "," in precisions.text):
        raise UsageError("--shape-buckets measures one target at one batch size and precision.",
                         "Give one --target, one --batch and one --precision (run bench again for another).")
    target = targets[0]
    if precisions.text:
        target = dataclasses.replace(target, precision=precisions.text.strip().lower())
    result = bench_buckets(model, target, ShapeBuckets.parse(shapes.buckets), sweep=sweep,
                           shapes=shapes.shapes or None, batch=shapes.batch, inputs=given.items, seed=given.seed,
                           value_ranges=given.value_ranges or None, warmup=timing.warmup, runs=timing.runs,
                           duration=timing.duration, strict=strict)
    if as_json:
        sys.stdout.write(json.dumps(clean(result.to_dict()), indent=2) + "\n")
        return
    console.print(f"[bold]{escape(result.model)}[/] on [bold]{escape(result.target)}[/], buckets "
                  f"{escape(result.buckets.describe())} ("
                  + ("a session per bucket" if result.per_bucket_sessions else "one session for every bucket") + ")")
    table = columns(new_table(), ("bucket", "feed", "compile s", "warm ms", "p50 ms", "p99 ms", "items/s"),
                    numbers=("compile s", "warm ms", "p50 ms", "p99 ms", "items/s"))
    for row in bucket_table_rows(result):
        table.add_row(*(escape(c) for c in row))
    console.print(table)
    for message in result.warnings:
        warn(message)


# -- shared with `tune` ---------------------------------------------------------------------------------

class CountColumn(ProgressColumn):
    """"done/total" where the total is known, just "done" where it is not (a --duration cell before its first
    sample), never "0/None"."""

    def render(self, task) -> Text:
        """The count of ``task``."""
        done = int(task.completed)
        return Text(f"{done}/{int(task.total)}" if task.total is not None else str(done), style="progress.download")


class SweepProgress:
    """Rich progress bars on stderr for sweep events: one bar for cells, one for the current cell's runs.

    ``errors_below``: the caller prints each failed cell's error after the sweep (bench's summary), so the line
    logged when a cell fails names the cell only and the error is printed once."""

    def __init__(self, disable: bool = False, errors_below: bool = False):
        self.errors_below = errors_below
        self.disable = disable or not err_console.is_terminal
        self.bar = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                            CountColumn(), TimeElapsedColumn(), console=err_console,
                            transient=True, disable=self.disable)
        self.cells = self.current = None
        self.quiet = disable

    def __enter__(self) -> SweepProgress:  # noqa: PYI034 - a plain class, not subclassed
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def log(self, text: str) -> None:
        """Print a line above the bars (nothing with --json)."""
        if not self.quiet:
            self.bar.console.print(text, highlight=False)

    def event(self, event) -> None:
        """Advance the bars for one sweep event (start, stage, cell-skip/-start/-progress/-done)."""
        kind = event.kind
        if kind == "start":
            if self.cells is None:
                self.cells = self.bar.add_task("cells", total=event.total)
            else:
                self.bar.update(self.cells, total=(self.bar.tasks[self.cells].total or 0) + event.total)
        elif kind == "stage":
            self.log(f"[bold]{escape(event.message)}[/]")
        elif kind == "cell-skip":
            self.log(f"[dim]done before, skipped: {escape(event.cell.id)}[/]")
        elif kind == "cell-start":
            if self.current is not None:
                self.bar.remove_task(self.current)
            self.current = self.bar.add_task(escape(event.cell.id), total=None)
        elif kind == "cell-progress" and self.current is not None:
            self.bar.update(self.current, completed=event.done, total=event.runs or None)
        elif kind == "cell-done":
            if self.cells is not None:
                self.bar.advance(self.cells)
            self.log(cell_line(event.result, error=not self.errors_below))


def cell_line(result, *, error: bool = True) -> str:
    """One line for a finished cell: ok with p50/p99/throughput, or failed with its message (``error=False``:
    without it, for a caller that prints the errors after the sweep)."""
    if result.ok:
        lat = result.latency
        extra = " [yellow](unstable)[/]" if result.warnings else ""
        acc = result.accuracy or {}
        if acc.get("passed") is False:
            extra += " [red]accuracy FAIL[/]"
        return (f"[green]ok[/] {escape(result.id)}: p50 {lat.p50:.3f} ms, p99 {lat.p99:.3f} ms, "
                f"{result.throughput:,.1f} items/s{extra}")
    if not error:
        return f"[red]failed[/] {escape(result.id)} (the error is printed at the end)"
    return f"[red]failed[/] {escape(result.id)}: {escape(str((result.error or {}).get('message')))}"


def render_report(report) -> None:
    """The report as a table for people, then its warnings, notes, failures and the baseline verdicts."""
    env = report.environment
    console.print(f"[bold]{escape(str(report.model.get('source')))}[/]: onnxruntime {env.get('onnxruntime')}, "
                  f"{escape(str(env.get('cpu')))}")
    table, sessions = bench_tables(report)
    console.print(table)
    if sessions.row_count:
        console.print(sessions)
    if report.startup:
        console.print(startup.Startup.from_dict(report.startup).line(), markup=False, highlight=False)
    _render_notes(report)
    base = report.baseline
    if base:
        console.print(f"against {escape(str(base['baseline']))}: {base['regressions']} regression(s), "
                      f"{base['gains']} gain(s) beyond noise")
        for change in base["changes"]:
            if change["verdict"] in ("regression", "gain", "now-failing", "now-passing"):
                delta = change.get("change")
                console.print(f"  {change['verdict']}: {escape(change['id'])}"
                              + (f" {100 * delta:+.1f}% latency" if isinstance(delta, float) else ""))


def bench_tables(report) -> tuple[Table, Table]:
    """The report's main table (latency, throughput, FLOP/s, accuracy) and its startup table (session creation
    and first run). Two tables, because eleven columns of numbers do not fit in 80 columns without splitting
    numbers."""
    table = new_table()
    text_column(table, "target", min_width=6)
    number_column(table, "batch")
    text_column(table, "io", no_wrap=True)
    for header in ("p50 ms", "p99 ms", "cv", "items/s", "FLOP/s"):
        number_column(table, header)
    text_column(table, "accuracy")
    startup = columns(new_table("startup"), ("target", "batch", "session s", "first run ms"),
                      numbers=("batch", "session s", "first run ms"))
    for cell in report.cells:
        row = terminal_row(cell)
        table.add_row(*row[:3], *row[5:], style=None if cell.ok else "red")
        if cell.ok:
            startup.add_row(*row[:2], *row[3:5])
    return table, startup


def terminal_row(cell) -> list[str]:
    """The cells of one table row for ``cell`` (rich markup escaped)."""
    from onnxaccel.bench.report_text import accuracy_text

    target = cell.cell.effective_target
    io = ("on" if cell.cell.iobinding else "off") + (f" x{cell.cell.concurrency}" if cell.cell.concurrency > 1 else "")
    io += f" i{cell.cell.instances}" if cell.cell.instances > 1 else ""
    if not cell.ok:
        return [escape(str(target)), str(cell.batch or "-"), io, "-", "-", "-", "-", "-", "-", "-", "FAILED"]
    lat, session, roof = cell.latency, cell.session or {}, cell.roofline or {}
    rate = flops_rate_text(roof)
    return [escape(str(target)), str(cell.batch), io, f"{session.get('create_s', 0):.2f}",
            f"{cell.timing.get('first_run_ms', 0):.1f}", f"{lat.p50:.3f}", f"{lat.p99:.3f}", f"{lat.cv:.0%}",
            si(cell.throughput), rate, escape(accuracy_text(cell, short=True))]


def flops_rate_text(roof: dict) -> str:
    """Achieved FLOP/s for the table: "1.23T 45%" (share of the device's peak), "≥9.91k" when the model's FLOP
    count is partial (arithmetic inside If/Loop/Scan bodies is not counted, so the rate is a lower bound), "-"
    when the count covers too few of the MAC ops to be a figure (``flops_coverage``, see _coverage_note)."""
    if roof.get("achieved_tflops") is None or not flops_counted(roof):
        return "-"
    rate = ("≥" if roof.get("flops_partial") else "") + si(roof["achieved_tflops"] * 1e12)
    if roof.get("pct_of_peak") is not None:
        rate += f" {roof['pct_of_peak']:.0f}%"
    return rate


def flops_counted(roof: dict) -> bool:
    """False when the roofline's FLOP count covers too few of the model's MAC ops to give a rate (its
    ``flops_coverage`` says so); True otherwise, a report without that key included."""
    coverage = roof.get("flops_coverage")
    return not isinstance(coverage, dict) or coverage.get("sufficient", True) is not False


def _coverage_note(report) -> str | None:
    """Why FLOP/s is not shown: what share of the nodes (and of the MAC ops) the count covers, and why."""
    cells = [c for c in report.ok_cells if c.roofline and not flops_counted(c.roofline)]
    if not cells:
        return None
    coverage = cells[0].roofline["flops_coverage"]
    mac_ops = (coverage.get("mac_ops") or {}).items()
    macs = ", ".join(f"{v.get('counted')} of {v.get('total')} {op}" for op, v in mac_ops)
    return (f"FLOP/s and roofline not shown for {len(cells)} cell(s): the FLOP count covers "
            f"{coverage.get('counted_nodes')} of {coverage.get('arithmetic_nodes')} nodes that do arithmetic"
            + (f" ({macs})" if macs else "") + "; not counted: " + "; ".join(coverage.get("reasons") or ["?"])
            + ". `onnxaccel inspect` shows the count.")


def _render_notes(report) -> None:
    from onnxaccel.bench.report_text import partial_flops_note

    uncovered = _coverage_note(report)
    if uncovered:
        warn(uncovered)
    partial = partial_flops_note(report)
    if partial and any(flops_counted(c.roofline or {}) for c in report.ok_cells if (c.roofline or {}).get(
            "flops_partial")):
        note(partial)
    seen: set[str] = set()
    for cell in report.ok_cells:
        for message in (cell.session or {}).get("warnings") or []:
            if message not in seen:
                seen.add(message)
                warn(f"{cell.cell.effective_target}: {message}")
    unstable = [c for c in report.ok_cells if c.latency.unstable]
    if unstable:
        warn(f"{len(unstable)} cell(s) with an unstable measurement (coefficient of variation > 10%, worst "
             f"{max(c.latency.cv for c in unstable):.0%}): the machine may be busy or its clocks changing; use more "
             "--runs or --duration, and compare medians rather than means.")
    for cell in report.ok_cells:
        t = cell.transfer
        if not (cell.cell.effective_target.is_gpu and t and "h2d_ms" in t):
            continue
        if t["h2d_ms"] + t["d2h_ms"] > 0.2 * t["compute_ms"]:
            note(f"{cell.id}: copies host->device {t['h2d_ms']:.3f} ms and device->host {t['d2h_ms']:.3f} ms against "
                 f"{t['compute_ms']:.3f} ms of compute: keep data on the device (IO binding) where you can.")
    failures: dict[tuple, list] = {}
    for cell in report.failed_cells:
        error = cell.error or {}
        failures.setdefault((error.get("message"), error.get("hint")), []).append(cell)
    for (message, hint), cells in failures.items():
        which = cells[0].id if len(cells) == 1 else f"{len(cells)} cells ({cells[0].id}, ...)"
        err_console.print(f"[red]failed[/] {escape(which)}: {escape(str(message))}", highlight=False)
        if hint:
            err_console.print(f"  [cyan]hint:[/] {escape(str(hint))}", highlight=False)

