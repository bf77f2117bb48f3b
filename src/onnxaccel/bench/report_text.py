"""CSV (one row per cell, every scalar metric) and Markdown (tables for people and pull requests)."""

from __future__ import annotations

import csv
import io
import textwrap
from typing import TYPE_CHECKING

from onnxaccel.bench.cells import CellResult

if TYPE_CHECKING:  # only for annotations: report.py imports this module to render
    from onnxaccel.bench.report import BenchReport

ROW_HEADERS = ("cell", "status", "batch", "session s", "first ms", "p50 ms", "p99 ms", "p99.9 ms", "cv",
               "items/s", "h2d / d2h ms", "TFLOP/s", "% peak", "accuracy", "GPU util %", "power W", "GPU mem GB")

CSV_COLUMNS = (
    "id", "target", "device", "precision", "precision_executed", "batch", "iobinding", "graph", "concurrency",
    "status", "error",
    "error_message", "error_hint", "prepare_s", "create_s", "first_inference_ms", "first_run_ms",
    "calls_per_sample", "count", "mean_ms", "stddev_ms", "min_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms",
    "p99_9_ms", "max_ms", "cv", "unstable", "throughput_items_per_s", "throughput_basis", "h2d_ms", "compute_ms",
    "d2h_ms", "gpu_name", "gpu_util_mean_pct", "gpu_util_peak_pct", "power_mean_w", "power_peak_w",
    "device_peak_bytes", "device_delta_bytes", "host_rss_bytes", "host_peak_rss_bytes", "flops_per_inference",
    "achieved_tflops", "peak_tflops", "pct_of_peak", "bound", "accuracy_passed", "accuracy_max_abs",
    "accuracy_reference", "flops_partial",
)


def series_name(cell: CellResult) -> str:
    """Cells that differ only in batch form one line in the plots."""
    name = f"{cell.cell.effective_target} io={'on' if cell.cell.iobinding else 'off'}"
    if cell.cell.concurrency > 1:
        name += f" c={cell.cell.concurrency}"
    if cell.cell.instances > 1:
        name += f" i={cell.cell.instances}"
    if cell.cell.tag:
        name += f" {cell.cell.tag}"
    return name


def cell_row(cell: CellResult) -> tuple:
    """One cell as a row of the text/Markdown table (``ROW_HEADERS``); failed cells show their message."""
    if not cell.ok:
        message = (cell.error or {}).get("message", "")
        return (cell.id, "FAILED", cell.batch or "-", *(["-"] * (len(ROW_HEADERS) - 4)), message[:80])
    lat, session = cell.latency, cell.session or {}
    roof, tel, transfer = cell.roofline or {}, cell.telemetry or {}, cell.transfer or {}
    copies = (f"{transfer['h2d_ms']:.3f} / {transfer['d2h_ms']:.3f}" if "h2d_ms" in transfer else "-")
    memory = (cell.memory or {}).get("device_peak_bytes")
    return (
        cell.id, "ok" if not cell.warnings else "ok (unstable)", cell.batch, _f(session.get("create_s"), 2),
        _f(cell.timing.get("first_run_ms"), 2), _f(lat.p50, 3), _f(lat.p99, 3), _f(lat.p999, 3), f"{lat.cv:.1%}",
        _f(cell.throughput, 1), copies, at_least(roof) + _f(roof.get("achieved_tflops"), 3),
        _f(roof.get("pct_of_peak"), 1),
        accuracy_text(cell), _f((tel.get("utilization_pct") or {}).get("mean"), 0),
        _f((tel.get("power_w") or {}).get("mean"), 0), _f(memory / 1e9 if memory else None, 2),
    )


def accuracy_text(cell: CellResult, *, short: bool = False) -> str:
    """The cell's accuracy verdict as short text (``short`` for narrow tables)."""
    accuracy = cell.accuracy or {}
    if not accuracy:
        return "-"
    if accuracy.get("reference") == "self":
        return "ref" if short else "reference"
    if accuracy.get("passed") is None:
        return "n/a"
    max_abs = accuracy.get("max_abs")
    value = (f" {max_abs:.1e}" if short else f" max|err| {max_abs:.2g}") if isinstance(max_abs, (int, float)) else ""
    return ("ok" if short else "pass") + value if accuracy["passed"] else "FAIL" + value


def at_least(roof: dict) -> str:
    """"≥" before a FLOP/s figure whose FLOP count is partial (a lower bound), else nothing."""
    return "≥" if roof.get("flops_partial") and roof.get("achieved_tflops") is not None else ""


def partial_flops_note(report: BenchReport) -> str | None:
    """A sentence saying which FLOP/s figures are lower bounds and why, or None when every count is complete."""
    partial = [c for c in report.ok_cells if (c.roofline or {}).get("flops_partial")]
    if not partial:
        return None
    roof = partial[0].roofline
    inside = roof.get("subgraph_nodes") or 0
    return (f"FLOP/s marked ≥ are lower bounds (partial: {roof.get('uncounted_nodes')} node(s) uncounted"
            + (f", {inside} node(s) inside If/Loop/Scan subgraphs" if inside else "")
            + "); `onnxaccel inspect` lists them.")


def executed_labels(report: BenchReport) -> dict[str, str]:
    """{target as asked: the precision its session computed in, e.g. 'fp16 on 2 of 47 nodes, fp32 elsewhere'}, from
    the plans of the report (``precision_executed``, set where onnxaccel converted the model)."""
    out: dict[str, str] = {}
    for plan in report.plans:
        executed = plan.get("precision_executed") or {}
        if executed.get("label"):
            out.setdefault(str(plan.get("requested")), executed["label"])
    return out


#: Width of the "what will run" block: a terminal's 80 columns, with a continuation indent.
PLAN_WIDTH = 80


def plan_lines(plan: dict) -> list[str]:
    """One plan (``ExecutionPlan.to_dict()``) as its "name: value (reason)" lines, as plan.py prints them."""
    return [f"{c.get('name')}: {_plan_value(c.get('value'))} ({c.get('reason')})" for c in plan.get("choices") or []]


def plan_block(report: BenchReport, width: int = PLAN_WIDTH) -> list[str]:
    """The "what will run" block: every prepared session's plan, its decisions wrapped to ``width`` columns
    (the first line of each plan is its target). Empty when no session was prepared yet."""
    out: list[str] = []
    for plan in report.plans:
        shapes = ", ".join(f"{k}[{'x'.join(str(d) for d in v)}]" for k, v in (plan.get("shapes") or {}).items())
        head = f"{plan.get('target')}" + (f", {shapes}" if shapes else "")
        out += textwrap.wrap(head, width, subsequent_indent="    ") or [head]
        for line in plan_lines(plan):
            if line.startswith("target: "):
                continue  # the plan's first line already names it
            out += textwrap.wrap(line, width, initial_indent="  ", subsequent_indent="      ",
                                 break_on_hyphens=False)
    return out


def _plan_value(value) -> str:
    # plan.py's _text, for the JSON form: booleans on/off, lists joined, None as "-".
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    return "-" if value is None else str(value)


def _f(value, digits: int) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) else "-"


def csv_row(cell: CellResult, executed: str | None = None) -> dict:
    """One cell as a flat CSV row keyed by ``CSV_COLUMNS``; ``executed`` is the precision its session computed in
    (:func:`executed_labels`), empty where it is the one asked or unknown."""
    lat = cell.latency.to_dict() if cell.latency else {}
    session, tel, roof = cell.session or {}, cell.telemetry or {}, cell.roofline or {}
    transfer, memory, accuracy, error = cell.transfer or {}, cell.memory or {}, cell.accuracy or {}, cell.error or {}
    target = cell.cell.effective_target
    row = {
        "id": cell.id, "target": str(target), "device": target.device, "precision": target.precision,
        "precision_executed": executed,
        "batch": cell.batch, "iobinding": cell.cell.iobinding, "graph": cell.cell.uses_graph,
        "concurrency": cell.cell.concurrency, "status": cell.status, "error": error.get("error"),
        "error_message": error.get("message"), "error_hint": error.get("hint"), "prepare_s": session.get("prepare_s"),
        "create_s": session.get("create_s"), "first_inference_ms": session.get("first_inference_ms"),
        "first_run_ms": cell.timing.get("first_run_ms"), "calls_per_sample": cell.timing.get("calls_per_sample"),
        "throughput_items_per_s": cell.timing.get("throughput_items_per_s"),
        "throughput_basis": cell.timing.get("throughput_basis"),
        "h2d_ms": transfer.get("h2d_ms"), "compute_ms": transfer.get("compute_ms"), "d2h_ms": transfer.get("d2h_ms"),
        "gpu_name": tel.get("name"), "gpu_util_mean_pct": (tel.get("utilization_pct") or {}).get("mean"),
        "gpu_util_peak_pct": (tel.get("utilization_pct") or {}).get("peak"),
        "power_mean_w": (tel.get("power_w") or {}).get("mean"), "power_peak_w": (tel.get("power_w") or {}).get("peak"),
        "device_peak_bytes": memory.get("device_peak_bytes"), "device_delta_bytes": memory.get("device_delta_bytes"),
        "host_rss_bytes": memory.get("rss_bytes"), "host_peak_rss_bytes": memory.get("peak_rss_bytes"),
        "flops_per_inference": roof.get("flops_per_inference"), "achieved_tflops": roof.get("achieved_tflops"),
        "peak_tflops": roof.get("peak_tflops"), "pct_of_peak": roof.get("pct_of_peak"), "bound": roof.get("bound"),
        "accuracy_passed": accuracy.get("passed"), "accuracy_max_abs": accuracy.get("max_abs"),
        "accuracy_reference": accuracy.get("reference"), "flops_partial": roof.get("flops_partial"),
    }
    for key in ("count", "mean_ms", "stddev_ms", "min_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99_9_ms",
                "max_ms", "cv", "unstable"):
        row[key] = lat.get(key)
    return row


def to_csv(report: BenchReport) -> str:
    """The report as CSV, one row per cell."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    executed = executed_labels(report)
    for cell in report.cells:
        row = csv_row(cell, executed.get(str(cell.cell.effective_target)))
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buffer.getvalue()


def to_markdown(report: BenchReport) -> str:
    """The report as Markdown: header, cell table, failed cells, baseline comparison and skipped cells."""
    env = report.environment
    lines = [f"# onnxaccel bench: {report.model.get('source')}", "",
             f"- started {report.created}, updated {report.updated}, "
             f"{'complete' if report.complete else 'incomplete (resume with --resume)'}",
             f"- onnxaccel {env.get('onnxaccel')}, onnxruntime {env.get('onnxruntime')}, Python {env.get('python')}",
             f"- CPU: {env.get('cpu')} ({env.get('logical_cpus')} logical)", ""]
    block = plan_block(report)
    if block:
        lines += ["## What will run", "", "```text", *block, "```", ""]
    lines += ["| " + " | ".join(ROW_HEADERS) + " |", "|" + "---|" * len(ROW_HEADERS)]
    lines += ["| " + " | ".join(_md(v) for v in cell_row(c)) + " |" for c in report.cells]
    partial = partial_flops_note(report)
    if partial:
        lines += ["", partial]
    if report.failed_cells:
        lines += ["", "## Failed cells", "", "| cell | stage | error | hint |", "|---|---|---|---|"]
        for cell in report.failed_cells:
            error = cell.error or {}
            lines.append(f"| {_md(cell.id)} | {_md(error.get('stage'))} | {_md(error.get('message'))} | "
                         f"{_md(error.get('hint'))} |")
    if report.baseline:
        base = report.baseline
        lines += ["", f"## Against baseline {base.get('baseline')}", "",
                  f"{base.get('regressions')} regression(s), {base.get('gains')} gain(s).", "",
                  "| cell | verdict | old p50 ms | new p50 ms | change |", "|---|---|---|---|---|"]
        for change in base.get("changes", []):
            delta = change.get("change")
            lines.append(f"| {_md(change['id'])} | {change['verdict']} | {_f(change.get('old_p50_ms'), 3)} | "
                         f"{_f(change.get('new_p50_ms'), 3)} | "
                         f"{f'{100 * delta:+.1f}%' if isinstance(delta, (int, float)) else '-'} |")
    if report.skipped:
        lines += ["", "## Skipped", ""] + [f"- `{s['id']}`: {s['reason']}" for s in report.skipped]
    return "\n".join(lines) + "\n"


def _md(value) -> str:
    return str(value if value is not None else "-").replace("|", "\\|").replace("\n", " ")
