"""How a model's cost grows with the symbolic dims nothing bound: ``inspect`` without shapes.

Graph statistics need concrete shapes. For the dims that neither ``--shape``, given inputs, metadata nor the
batch default bind (model_shapes' resolution order), ``inspect`` binds example values and reports the totals
there, plus a formula in those dims found by measuring, not by algebra: the statistics are computed again with
each dim doubled, and

* when every ratio is a power of two (within 1 %), the cost is a monomial in the dims
  (``4.77 GFLOP × (x[2]×x[3])/(640×640)``), checked once more with all dims doubled at once;
* with a single dim that is not a monomial (attention's ``sequence²`` next to the linear layers), the cost
  is fitted as ``c0 + c1·d + c2·d²`` through three sizes and checked at a fourth;
* otherwise no formula is claimed: the samples themselves are reported.

The samples are always part of the JSON, so a reader can check the fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from onnxaccel.analysis.graph_stats import GraphStats, graph_stats
from onnxaccel.errors import ShapeError
from onnxaccel.model import Model
from onnxaccel.model_shapes import UnboundDim, bind_examples

#: Metric name -> (how to read it from GraphStats, unit).
METRICS: dict[str, tuple[Callable[[GraphStats], float], str]] = {
    "flops": (lambda s: s.total_flops, "FLOP"),
    "macs": (lambda s: s.total_macs, "MAC"),
    "activation_peak_bytes": (lambda s: s.activation_peak_bytes, "B"),
    "activation_total_bytes": (lambda s: s.activation_total_bytes, "B"),
}
_TOLERANCE = 0.01


@dataclass
class MetricScaling:
    """One metric at the example values, and its formula in the example dims when one fits."""
    name: str
    unit: str
    value: float
    kind: str  # monomial | polynomial | constant | none
    exponents: dict[str, int] = field(default_factory=dict)
    coefficients: list[float] = field(default_factory=list)  # c0, c1, c2 of the polynomial in one dim
    examples: dict[str, int] = field(default_factory=dict)

    def formula(self) -> str | None:
        """The formula as text: ``2.04 GFLOP × (height×width)/(320×320)``, ``c0 + c1×sequence + ...``."""
        if self.kind == "constant":
            return f"{si(self.value)}{self.unit} (independent of {', '.join(self.examples)})"
        if self.kind == "monomial":
            dims = [(d, k) for d, k in self.exponents.items() if k]
            num = "×".join(d + _power(k) for d, k in dims)
            den = "×".join(str(self.examples[d]) + _power(k) for d, k in dims)
            return f"{si(self.value)}{self.unit} × ({num})/({den})"
        if self.kind == "polynomial":
            (dim,) = self.examples
            terms = [f"{si(c)}{self.unit}" + ("" if i == 0 else f"×{dim}{_power(i)}")
                     for i, c in enumerate(self.coefficients) if abs(c) >= 0.5]
            return " + ".join(reversed(terms)) or f"0 {self.unit}"
        return None

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"value": self.value, "unit": self.unit, "kind": self.kind, "formula": self.formula(),
                "exponents": self.exponents or None, "coefficients": self.coefficients or None}


@dataclass
class CostScaling:
    """Statistics at the example values, per-metric formulas, and every sample measured."""
    dims: list[UnboundDim]
    examples: dict[str, int]
    metrics: dict[str, MetricScaling]
    samples: list[dict] = field(default_factory=list)

    def label(self) -> str:
        """``at height=640, width=640 (example values; bind with --shape)``."""
        return "at " + ", ".join(f"{k}={v}" for k, v in self.examples.items()) + \
            " (example values; bind with --shape)"

    def to_dict(self) -> dict:
        """JSON-ready form: the example dims and values, the formulas, the samples."""
        return {"example_values": self.examples, "example_dims": [d.to_dict() for d in self.dims],
                "label": self.label(), "metrics": {k: m.to_dict() for k, m in self.metrics.items()},
                "samples": self.samples}


def cost_scaling(model: Model, dims: Sequence[UnboundDim], base: GraphStats,
                 shapes: Mapping[str, Sequence[int]] | None = None, batch: int | None = None) -> CostScaling:
    """Fit each metric of ``base`` (the statistics at the dims' example values) as a formula in those dims."""
    examples = {d.label: d.example for d in dims}
    measure = _Measure(model, dict(shapes or {}), batch, examples)
    measure.add(examples, base)
    doubled = {d: measure.at({**examples, d: 2 * v}) for d, v in examples.items()}
    metrics = {}
    for name, (read, unit) in METRICS.items():
        metrics[name] = _fit(name, unit, read, base, doubled, examples, measure)
    return CostScaling(list(dims), examples, metrics, measure.samples)


class _Measure:
    """Graph statistics at given example values, each point computed once and kept as a sample."""

    def __init__(self, model: Model, shapes: dict, batch: int | None, examples: dict[str, int]):
        self.model, self.shapes, self.batch = model, shapes, batch
        self.cache: dict[tuple, GraphStats | None] = {}
        self.samples: list[dict] = []
        self.order = list(examples)

    def add(self, values: dict[str, int], stats: GraphStats | None) -> None:
        self.cache[tuple(values[k] for k in self.order)] = stats
        if stats is not None:
            self.samples.append({"values": dict(values), **{k: read(stats) for k, (read, _) in METRICS.items()}})

    def at(self, values: dict[str, int]) -> GraphStats | None:
        key = tuple(values[k] for k in self.order)
        if key not in self.cache:
            try:
                bound, _ = bind_examples(self.model, self.shapes, self.batch, values)
                stats = graph_stats(bound)
            except ShapeError:  # an unreadable dim name shared by two inputs cannot be varied alone
                stats = None
            self.add(values, stats)
        return self.cache[key]


def _fit(name: str, unit: str, read, base: GraphStats, doubled: dict[str, GraphStats | None],
         examples: dict[str, int], measure: _Measure) -> MetricScaling:
    value = float(read(base))
    result = MetricScaling(name, unit, value, "none", examples=dict(examples))
    counts_nodes = name in ("flops", "macs")
    if any(s is None for s in doubled.values()) or counts_nodes and (
            base.partial or any(s.partial for s in doubled.values())):
        return result  # a lower bound does not scale like the cost
    exponents = {d: _exponent(value, float(read(s))) for d, s in doubled.items()}
    if all(k is not None for k in exponents.values()):
        if all(k == 0 for k in exponents.values()):
            result.kind = "constant"
            return result
        if len(examples) == 1 or _holds(read, measure, examples, lambda x: value * math.prod(
                (x[d] / examples[d]) ** k for d, k in exponents.items())):
            result.kind, result.exponents = "monomial", {d: int(k) for d, k in exponents.items()}
        return result
    if len(examples) == 1:
        (dim, v), = examples.items()
        coefficients = _quadratic(read, measure, dim, v)
        if coefficients is not None:
            result.kind, result.coefficients = "polynomial", coefficients
    return result


def _exponent(a: float, b: float) -> int | None:
    """k when b/a is 2**k for k in 0..3 (within the tolerance), else None."""
    if a <= 0 or b <= 0:
        return 0 if a == b else None
    for k in range(4):
        if abs(b / a / 2 ** k - 1) <= _TOLERANCE:
            return k
    return None


def _holds(read, measure: _Measure, examples: dict[str, int], predict) -> bool:
    """The formula ``predict`` agrees with a measurement at all dims doubled at once."""
    point = {d: 2 * v for d, v in examples.items()}
    stats = measure.at(point)
    return stats is not None and _close(float(read(stats)), predict(point))


def _quadratic(read, measure: _Measure, dim: str, v: int) -> list[float] | None:
    """c0, c1, c2 through the sizes v, 2v, 4v; None unless it also predicts 3v."""
    xs = [v, 2 * v, 4 * v]
    stats = [measure.at({dim: x}) for x in xs]
    check = measure.at({dim: 3 * v})
    if any(s is None for s in [*stats, check]):
        return None
    ys = [float(read(s)) for s in stats]
    c0, c1, c2 = _solve3(xs, ys)
    predicted = c0 + c1 * 3 * v + c2 * (3 * v) ** 2
    return [c0, c1, c2] if _close(float(read(check)), predicted) else None


def _solve3(xs: list[int], ys: list[float]) -> tuple[float, float, float]:
    """The quadratic through three points (Lagrange form expanded)."""
    (x0, x1, x2), (y0, y1, y2) = xs, ys
    d0, d1, d2 = (x0 - x1) * (x0 - x2), (x1 - x0) * (x1 - x2), (x2 - x0) * (x2 - x1)
    c2 = y0 / d0 + y1 / d1 + y2 / d2
    c1 = -(y0 * (x1 + x2) / d0 + y1 * (x0 + x2) / d1 + y2 * (x0 + x1) / d2)
    c0 = y0 * x1 * x2 / d0 + y1 * x0 * x2 / d1 + y2 * x0 * x1 / d2
    return c0, c1, c2


def _close(measured: float, predicted: float) -> bool:
    return abs(measured - predicted) <= _TOLERANCE * max(abs(measured), 1.0)


def _power(k: int) -> str:
    return {1: "", 2: "²", 3: "³"}.get(k, f"^{k}")


def si(value: float) -> str:
    """``4.77 G``, ``512 k``, ``12 `` (a space before the unit in every case)."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} "
