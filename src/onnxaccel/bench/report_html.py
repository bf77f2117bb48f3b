"""One self-contained HTML page: summary, plots (inline SVG), every cell, failures, baseline changes.

Nothing is loaded from elsewhere (no CDN, no script, no web font), so the page works offline and can be
attached to a bug report as one file. Every piece of text from the model, targets or errors is escaped.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from onnxaccel.bench import svg
from onnxaccel.bench.cells import CellResult
from onnxaccel.bench.report_text import ROW_HEADERS, cell_row, plan_block, series_name

if TYPE_CHECKING:  # only for annotations: report.py imports this module to render
    from onnxaccel.bench.report import BenchReport

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1a1a1a;max-width:1500px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:12px;margin:6px 0}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left} .meta{color:#555;font-size:13px}
.plots{display:flex;flex-wrap:wrap;gap:16px} .hist{display:flex;flex-wrap:wrap;gap:8px}
.bad{color:#b00020} .good{color:#00703c} .warn{color:#8a5a00} code{font-size:12px}
"""


def to_html(report: BenchReport) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG charts, no scripts)."""
    model = report.model
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>onnxaccel bench: {escape(str(model.get('source')))}</title>", f"<style>{_CSS}</style></head><body>",
        f"<h1>onnxaccel bench: {escape(str(model.get('source')))}</h1>",
        f'<p class="meta">{_meta(report)}</p>',
    ]
    parts += _summary(report)
    block = plan_block(report)
    if block:
        parts += ["<h2>What will run</h2>", "<pre>" + escape("\n".join(block)) + "</pre>"]
    parts += _plots(report)
    parts += _cells_table(report)
    parts += _failures(report)
    parts += _baseline(report)
    parts += _tune(report)
    if report.skipped or report.notes:
        parts.append("<h2>Skipped and notes</h2><ul>")
        parts += [f"<li><code>{escape(s['id'])}</code>: {escape(s['reason'])}</li>" for s in report.skipped]
        parts += [f"<li>{escape(n)}</li>" for n in report.notes]
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _meta(report: BenchReport) -> str:
    env = report.environment
    gpus = sorted({c.telemetry["name"] for c in report.ok_cells if c.telemetry and c.telemetry.get("available")})
    bits = [f"schema onnxaccel.bench/2, started {escape(report.created)}, updated {escape(report.updated)}",
            "complete" if report.complete else '<span class="warn">incomplete (resume with --resume)</span>',
            f"onnxaccel {escape(str(env.get('onnxaccel')))}, onnxruntime {escape(str(env.get('onnxruntime')))}, "
            f"Python {escape(str(env.get('python')))}",
            f"CPU: {escape(str(env.get('cpu')))} ({env.get('logical_cpus')} logical)"]
    if gpus:
        bits.append("GPU: " + escape(", ".join(gpus)))
    return "<br>".join(bits)


def _summary(report: BenchReport) -> list[str]:
    ok = report.ok_cells
    out = ["<h2>Summary</h2>",
           f"<p>{len(report.cells)} cells: {len(ok)} ok, "
           f'<span class="{"bad" if report.failed_cells else ""}">{len(report.failed_cells)} failed</span>, '
           f"{len(report.skipped)} skipped.</p>"]
    if ok:
        best = max(ok, key=lambda c: c.throughput or 0.0)
        fastest = min(ok, key=lambda c: c.latency.p50)
        out.append(f"<p>Highest throughput: <b>{svg.fmt(best.throughput or 0)} items/s</b> with "
                   f"<code>{escape(best.id)}</code>.<br>Lowest median latency: <b>{fastest.latency.p50:.3f} ms</b> "
                   f"with <code>{escape(fastest.id)}</code>.</p>")
    return out


def _plots(report: BenchReport) -> list[str]:
    ok = report.ok_cells
    if not ok:
        return []
    series: dict[str, list[CellResult]] = {}
    for cell in ok:
        series.setdefault(series_name(cell), []).append(cell)
    colors = {name: svg.color(i) for i, name in enumerate(series)}
    batches = sorted({c.batch or 1 for c in ok})
    out = ["<h2>Plots</h2>", '<div class="plots">']
    if len(batches) > 1:
        log_x = batches[-1] / max(batches[0], 1) >= 8
        lat = [svg.Series(n, tuple((c.batch or 1, c.latency.p50) for c in cs), colors[n]) for n, cs in series.items()]
        thr = [svg.Series(n, tuple((c.batch or 1, c.throughput or 0.0) for c in cs), colors[n])
               for n, cs in series.items()]
        out.append(svg.line_chart(lat, title="Median latency against batch", x_label="batch",
                                  y_label="p50 latency (ms)", chart_id="plot-latency", log_x=log_x))
        out.append(svg.line_chart(thr, title="Throughput against batch", x_label="batch",
                                  y_label="items/s", chart_id="plot-throughput", log_x=log_x))
    bars = [(f"{c.id}", c.throughput or 0.0, colors[series_name(c)]) for c in ok]
    out.append(svg.bar_chart(bars, title="Throughput per cell", value_label="items/s", chart_id="plot-throughput-bars"))
    lat_bars = [(f"{c.id}", c.latency.p50, colors[series_name(c)]) for c in ok]
    out.append(svg.bar_chart(lat_bars, title="Median latency per cell", value_label="ms", chart_id="plot-latency-bars"))
    out.append("</div><h2>Latency histograms</h2>")
    out.append('<p class="meta">Samples between the 0.5th and 99.5th percentile; the end bins hold the tails.</p>')
    out.append('<div class="hist">')
    for index, cell in enumerate(ok[:48]):
        if cell.histogram and cell.histogram.counts:
            out.append(svg.histogram_chart(cell.histogram.edges_ms, cell.histogram.counts, title=cell.id,
                                           chart_id=f"hist-{index}", fill=colors[series_name(cell)]))
    out.append("</div>")
    return out


def _cells_table(report: BenchReport) -> list[str]:
    if not report.cells:
        return ["<h2>Cells</h2><p>No cell has finished yet.</p>"]
    out = ["<h2>Cells</h2>", "<table><tr>" + "".join(
        f'<th class="{"l" if i < 2 else ""}">{escape(h)}</th>' for i, h in enumerate(ROW_HEADERS)) + "</tr>"]
    for cell in report.cells:
        row = cell_row(cell)
        klass = "" if cell.ok else ' class="bad"'
        out.append(f"<tr{klass}>" + "".join(
            f'<td class="{"l" if i < 2 else ""}">{escape(str(v))}</td>' for i, v in enumerate(row)) + "</tr>")
    out.append("</table>")
    warned = [c for c in report.ok_cells if c.warnings or (c.session and c.session.get("warnings"))]
    if warned:
        out.append("<ul>")
        for cell in warned:
            for message in list(cell.warnings) + list((cell.session or {}).get("warnings") or []):
                out.append(f'<li class="warn"><code>{escape(cell.id)}</code>: {escape(message)}</li>')
        out.append("</ul>")
    return out


def _failures(report: BenchReport) -> list[str]:
    failed = report.failed_cells
    if not failed:
        return []
    out = ["<h2>Failed cells</h2>", '<table><tr><th class="l">cell</th><th class="l">stage</th>'
           '<th class="l">error</th><th class="l">hint</th></tr>']
    for cell in failed:
        error = cell.error or {}
        out.append(f'<tr><td class="l"><code>{escape(cell.id)}</code></td>'
                   f'<td class="l">{escape(str(error.get("stage")))}'
                   f'</td><td class="l bad">{escape(str(error.get("message")))}</td>'
                   f'<td class="l">{escape(str(error.get("hint") or ""))}</td></tr>')
    out.append("</table>")
    return out


def _baseline(report: BenchReport) -> list[str]:
    base = report.baseline
    if not base:
        return []
    out = [f"<h2>Against baseline {escape(str(base.get('baseline')))}</h2>",
           f"<p>{base.get('regressions', 0)} regression(s), {base.get('gains', 0)} gain(s); a change counts beyond "
           f"{100 * float(base.get('threshold', 0)):.0f}% and {base.get('sigmas')} standard errors.</p>",
           '<table><tr><th class="l">cell</th><th class="l">verdict</th><th>old p50 ms</th><th>new p50 ms</th>'
           '<th>change</th><th>noise</th></tr>']
    for change in base.get("changes", []):
        verdict = change["verdict"]
        klass = ("bad" if verdict in ("regression", "now-failing")
                 else "good" if verdict in ("gain", "now-passing") else "")
        out.append(f'<tr><td class="l"><code>{escape(change["id"])}</code></td><td class="l {klass}">{escape(verdict)}'
                   f"</td><td>{_num(change.get('old_p50_ms'))}</td><td>{_num(change.get('new_p50_ms'))}</td>"
                   f"<td>{_pct(change.get('change'))}</td><td>{_pct(change.get('noise'))}</td></tr>")
    out.append("</table>")
    return out


def _tune(report: BenchReport) -> list[str]:
    tune = report.tune
    if not tune:
        return []
    out = ["<h2>Tune</h2>"]
    best = tune.get("best")
    if best:
        out.append(f"<p>Best: <code>{escape(str(best.get('id')))}</code>, {svg.fmt(best.get('throughput') or 0)} "
                   f"items/s, p50 {_num(best.get('p50_ms'))} ms, p99 {_num(best.get('p99_ms'))} ms.</p>")
    for line in tune.get("summary", []):
        out.append(f"<p>{escape(str(line))}</p>")
    return out


def _num(value) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "-"


def _pct(value) -> str:
    return f"{100 * value:+.1f}%" if isinstance(value, (int, float)) else "-"
