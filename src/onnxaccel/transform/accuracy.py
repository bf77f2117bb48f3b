"""The accuracy gate: criteria, their verdict, and the comparison tools it is given.

Import rule (DESIGN.md): ``transform`` must not import ``analysis``. Comparing outputs and locating the first
diverging node live in ``analysis`` (``compare.compare_outputs``, ``bisect.find_divergence``); the code that
composes both (the ``optimize`` command) passes them in as :class:`AccuracyTools`. This module only reads
the results by duck typing: ``.passed``, ``.outputs[i].max_abs / .nan / .inf / .topk``, ``.to_dict()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from onnxaccel.errors import UsageError


@dataclass(frozen=True)
class AccuracyTools:
    """``compare(reference, candidate, *, atol, rtol, topk)`` -> result with ``.passed``, ``.outputs``;
    ``find_divergence(model, target_a, target_b, feeds, *, atol, rtol)`` -> result with ``.found``, ``.node``."""

    compare: Callable[..., Any]
    find_divergence: Callable[..., Any]


@dataclass(frozen=True)
class GateSpec:
    """What "accurate enough" means for one optimize run.

    ``elementwise``: every element within ``atol + rtol * |reference|``; ``max_error``: largest absolute
    error over all outputs; ``min_topk_agreement``: for classifier-like outputs ([N, C]), the fraction of rows
    whose best class agrees (``topk`` = 1) or the mean overlap of the K best classes (``topk`` > 1);
    ``min_cosine``: every output's cosine similarity with the reference (catches a quantization that
    collapsed, e.g. outputs rounded to zero, rather than small accuracy drops).
    Non-finite values that appear only in the optimized model always fail.
    """

    atol: float
    rtol: float
    elementwise: bool = True
    max_error: float | None = None
    min_topk_agreement: float | None = None
    topk: int = 1
    min_cosine: float | None = None

    def __post_init__(self):
        if self.max_error is not None and (not math.isfinite(self.max_error) or self.max_error < 0):
            raise UsageError(f"--max-error must be a number >= 0, got {self.max_error}.", "e.g. --max-error 0.01")
        if self.min_topk_agreement is not None and not 0.0 <= self.min_topk_agreement <= 1.0:
            raise UsageError(f"--min-topk-agreement is a fraction in [0, 1], got {self.min_topk_agreement}.",
                             "e.g. --min-topk-agreement 0.99")
        if self.min_cosine is not None and not -1.0 <= self.min_cosine <= 1.0:
            raise UsageError(f"--min-cosine is within [-1, 1], got {self.min_cosine}.", "e.g. --min-cosine 0.99")
        if self.topk < 1:
            raise UsageError(f"--topk must be at least 1, got {self.topk}.", "e.g. --topk 1")

    def to_dict(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol, "elementwise": self.elementwise, "max_error": self.max_error,
                "min_topk_agreement": self.min_topk_agreement, "topk": self.topk, "min_cosine": self.min_cosine}


@dataclass
class GateCheck:
    name: str
    threshold: float | None
    value: float | None
    passed: bool
    detail: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "threshold": _num(self.threshold), "value": _num(self.value),
                "passed": self.passed, "detail": self.detail}


@dataclass
class GateResult:
    passed: bool
    checks: list[GateCheck]
    comparison: dict = field(default_factory=dict)
    #: Largest absolute error and worst top-k agreement over the outputs, for tables.
    max_abs: float | None = None
    topk_agreement: float | None = None

    def to_dict(self) -> dict:
        return {"passed": self.passed, "checks": [c.to_dict() for c in self.checks], "max_abs": _num(self.max_abs),
                "topk_agreement": _num(self.topk_agreement), "comparison": self.comparison}


def evaluate(comparison: Any, spec: GateSpec) -> GateResult:
    """Apply ``spec`` to a compare result (analysis.compare.CompareResult or anything shaped like it)."""
    outputs = list(comparison.outputs)
    checks = []
    new_special = [o.name for o in outputs if o.nan[1] > o.nan[0] or o.inf[1] > o.inf[0]]
    checks.append(GateCheck("finite", None, float(len(new_special)), not new_special,
                            f"NaN/Inf only in the optimized model: {', '.join(new_special)}" if new_special
                            else "no new NaN/Inf"))
    missing = list(getattr(comparison, "missing", ()))
    if missing:
        checks.append(GateCheck("outputs", None, float(len(missing)), False, f"outputs on one side only: {missing}"))
    max_abs = max((o.max_abs for o in outputs), default=0.0)
    if any(math.isnan(o.max_abs) for o in outputs):
        max_abs = math.inf  # a shape mismatch reports NaN
    if spec.elementwise:
        failed = [o.name for o in outputs if not o.passed]
        checks.append(GateCheck("elementwise", None, float(len(failed)), not failed,
                                f"atol={spec.atol:g}, rtol={spec.rtol:g}; failing: {', '.join(failed) or 'none'}"))
    if spec.max_error is not None:
        checks.append(GateCheck("max_error", spec.max_error, max_abs, max_abs <= spec.max_error,
                                "largest absolute error over all outputs"))
    agreements = [_agreement(o.topk, spec.topk) for o in outputs if o.topk is not None]
    worst = min(agreements) if agreements else None
    if spec.min_topk_agreement is not None:
        if worst is None:
            checks.append(GateCheck("topk_agreement", spec.min_topk_agreement, None, False,
                                    "no classifier-like output ([N, C] float) to measure top-k agreement on; "
                                    "use --max-error instead"))
        else:
            checks.append(GateCheck("topk_agreement", spec.min_topk_agreement, worst, worst >= spec.min_topk_agreement,
                                    f"top-{spec.topk} agreement, worst output"))
    if spec.min_cosine is not None:
        cosines = [o.cosine for o in outputs]
        low = min(cosines, default=1.0)
        low = -1.0 if math.isnan(low) else low
        checks.append(GateCheck("cosine", spec.min_cosine, low, low >= spec.min_cosine,
                                "cosine similarity with the reference, worst output"))
    return GateResult(all(c.passed for c in checks), checks, comparison.to_dict(), max_abs, worst)


def _agreement(topk: Any, k: int) -> float:
    return float(topk.top1 if k == 1 else topk.topk_overlap)


def _num(value: float | None):
    if value is None or math.isfinite(value):
        return value
    return str(value)
