"""Plots as inline SVG text: line charts, horizontal bar charts and histograms. No JavaScript, no fonts or
files from elsewhere, so a report opens offline and renders the same in any browser. Hovering a point or a
bar shows its value through SVG's own ``<title>`` tooltip."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

#: Colours that stay distinct for colour-blind readers (Okabe & Ito, "Color Universal Design", 2008),
#: then a few more.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
           "#7F7F7F", "#8C564B")
_FONT = 'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif"'


@dataclass(frozen=True)
class Series:
    """One named line of a chart: its (x, y) points and colour."""
    name: str
    points: tuple[tuple[float, float], ...]
    color: str


def color(index: int) -> str:
    """The palette colour for the ``index``-th series (the palette repeats)."""
    return PALETTE[index % len(PALETTE)]


def fmt(value: float) -> str:
    """A short axis label for ``value`` (3 significant digits, k/M suffixes)."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.3g}k"
    if magnitude >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (Heckbert, "Nice numbers for graph labels", Graphics Gems 1990)."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count - 1, 1)
    exp = math.floor(math.log10(raw))
    frac = raw / 10 ** exp
    step = (1 if frac < 1.5 else 2 if frac < 3 else 5 if frac < 7 else 10) * 10 ** exp
    start = math.floor(lo / step) * step
    ticks, value = [], start
    while value <= hi + step * 0.5:
        ticks.append(round(value, 12))
        value += step
    return ticks


class _Frame:
    """Maps data to pixels inside the plot area; log axes map log10(value)."""

    def __init__(self, width, height, x_range, y_range, log_x, log_y, left=70, right=170, top=36, bottom=48):
        self.width, self.height = width, height
        self.left, self.right, self.top, self.bottom = left, right, top, bottom
        self.log_x, self.log_y = log_x, log_y
        self.x0, self.x1 = (self._t(v, log_x) for v in x_range)
        self.y0, self.y1 = (self._t(v, log_y) for v in y_range)
        if self.x1 == self.x0:
            self.x0, self.x1 = self.x0 - 0.5, self.x1 + 0.5
        if self.y1 == self.y0:
            self.y1 = self.y0 + 1.0

    @staticmethod
    def _t(value: float, log: bool) -> float:
        return math.log10(value) if log else value

    def x(self, value: float) -> float:
        span = self.width - self.left - self.right
        return self.left + (self._t(value, self.log_x) - self.x0) / (self.x1 - self.x0) * span

    def y(self, value: float) -> float:
        span = self.height - self.top - self.bottom
        return self.height - self.bottom - (self._t(value, self.log_y) - self.y0) / (self.y1 - self.y0) * span


def _open(chart_id: str, width: int, height: int, title: str, kind: str) -> list[str]:
    return [f'<svg id="{escape(chart_id)}" class="chart {kind}" xmlns="http://www.w3.org/2000/svg" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="{escape(title)}" {_FONT} font-size="12">',
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
            f'<text x="{width / 2:.1f}" y="20" text-anchor="middle" font-size="14" font-weight="600">'
            f'{escape(title)}</text>']


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str, chart_id: str,
               log_x: bool = False, log_y: bool = False, width: int = 960, height: int = 380) -> str:
    """Lines with a marker at every point; the legend at the right names each series."""
    points = [p for s in series for p in s.points if (not log_x or p[0] > 0) and (not log_y or p[1] > 0)]
    out = _open(chart_id, width, height, title, "line")
    if not points:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no data</text></svg>')
        return "\n".join(out)
    xs = sorted({p[0] for p in points})
    ys = [p[1] for p in points]
    y_ticks = nice_ticks(0.0 if not log_y else min(ys), max(ys))
    x_ticks = xs if log_x or len(xs) <= 8 else nice_ticks(min(xs), max(xs))
    frame = _Frame(width, height, (min(xs), max(xs)), (y_ticks[0] if not log_y else min(ys), y_ticks[-1]),
                   log_x, log_y, right=340)
    _axes(out, frame, x_ticks, y_ticks if not log_y else sorted(set(ys))[:6], x_label, y_label)
    for index, s in enumerate(series):
        pts = [(frame.x(x), frame.y(y)) for x, y in sorted(s.points) if (not log_x or x > 0) and (not log_y or y > 0)]
        if len(pts) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            out.append(f'<polyline class="series" data-series="{escape(s.name)}" points="{path}" fill="none" '
                       f'stroke="{s.color}" stroke-width="2.5"/>')
        for (px, py), (x, y) in zip(pts, sorted(s.points)):
            out.append(f'<circle class="point" cx="{px:.1f}" cy="{py:.1f}" r="5" fill="{s.color}">'
                       f'<title>{escape(s.name)}: {fmt(x)} -> {fmt(y)}</title></circle>')
        ly = frame.top + 8 + index * 18
        lx = width - frame.right + 14
        out.append(f'<rect x="{lx}" y="{ly - 8}" width="14" height="10" fill="{s.color}"/>'
                   f'<text x="{lx + 20}" y="{ly + 1}">{escape(_short(s.name, 48))}</text>')
    out.append("</svg>")
    return "\n".join(out)


def bar_chart(bars: Sequence[tuple[str, float, str]], *, title: str, value_label: str, chart_id: str,
              width: int = 960) -> str:
    """Horizontal bars, one per (label, value, colour), longest label space on the left."""
    row = 22
    height = 60 + row * max(len(bars), 1)
    out = _open(chart_id, width, height, title, "bar")
    if not bars:
        out.append('<text x="20" y="50">no data</text></svg>')
        return "\n".join(out)
    left, right = 400, 90
    top = 34
    peak = max(v for _, v, _ in bars) or 1.0
    span = width - left - right
    for index, (label, value, fill) in enumerate(bars):
        y = top + index * row
        w = max(1.0, value / peak * span)
        out.append(f'<text x="{left - 8}" y="{y + 14}" text-anchor="end">{escape(_short(label, 60))}</text>'
                   f'<rect class="bar" x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{fill}">'
                   f'<title>{escape(label)}: {fmt(value)} {escape(value_label)}</title></rect>'
                   f'<text x="{left + w + 6:.1f}" y="{y + 14}">{fmt(value)}</text>')
    out.append(f'<text x="{left + span / 2:.1f}" y="{height - 8}" text-anchor="middle">{escape(value_label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def histogram_chart(edges: Sequence[float], counts: Sequence[int], *, title: str, chart_id: str, fill: str,
                    width: int = 360, height: int = 220) -> str:
    """An inline SVG bar chart of a latency histogram (``edges`` one longer than ``counts``)."""
    out = _open(chart_id, width, height, title, "histogram")
    if not counts:
        out.append('<text x="20" y="50">no data</text></svg>')
        return "\n".join(out)
    frame = _Frame(width, height, (edges[0], edges[-1]), (0, max(counts)), False, False, left=44, right=12,
                   top=30, bottom=40)
    _axes(out, frame, nice_ticks(edges[0], edges[-1], 4), nice_ticks(0, max(counts), 4), "latency (ms)", "calls")
    for lo, hi, n in zip(edges, edges[1:], counts):
        x0, x1, y = frame.x(lo), frame.x(hi), frame.y(n)
        out.append(f'<rect class="bin" x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0 - 1, 1):.1f}" '
                   f'height="{frame.y(0) - y:.1f}" fill="{fill}"><title>{fmt(lo)}-{fmt(hi)} ms: {n}</title></rect>')
    out.append("</svg>")
    return "\n".join(out)


def _axes(out: list[str], frame: _Frame, x_ticks, y_ticks, x_label: str, y_label: str) -> None:
    left, right = frame.left, frame.width - frame.right
    top, bottom = frame.top, frame.height - frame.bottom
    for value in y_ticks:
        y = frame.y(value)
        if top - 1 <= y <= bottom + 1:
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                       f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(value)}</text>')
    for value in x_ticks:
        x = frame.x(value)
        if left - 1 <= x <= right + 1:
            out.append(f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 5}" stroke="#333"/>'
                       f'<text x="{x:.1f}" y="{bottom + 18}" text-anchor="middle">{fmt(value)}</text>')
    out.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#333"/>'
               f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#333"/>'
               f'<text x="{(left + right) / 2:.1f}" y="{frame.height - 8}" text-anchor="middle">'
               f'{escape(x_label)}</text>'
               f'<text x="14" y="{(top + bottom) / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {(top + bottom) / 2:.1f})">{escape(y_label)}</text>')


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
