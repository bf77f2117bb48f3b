"""What "accurate enough" means: criteria (:class:`GateSpec`) applied to a :class:`CompareResult`.

``optimize``'s accuracy gate, ``bench``/``tune``'s accuracy column and the ``compare`` thresholds judge by
these same rules: no NaN/Inf that the reference lacks, no output missing on one side, then whichever of the
element-wise, largest-error, top-k agreement and cosine criteria the spec asks for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from onnxaccel.compare.outputs import CompareResult, TopKAgreement
from onnxaccel.errors import UsageError


@dataclass(frozen=True)
class GateSpec:
    """What "accurate enough" means for one optimize run (or one benchmark cell).

    ``elementwise``: every element within ``atol + rtol * |reference|``; ``max_error``: largest absolute
    error over all outputs; ``min_topk_agreement``: for classifier-like outputs ([N, C]), the fraction of rows
    whose best class agrees (``topk`` = 1) or the mean overlap of the K best classes (``topk`` > 1);
    ``min_cosine``: every output's cosine similarity with the reference (catches a quantization that
    collapsed, e.g. outputs rounded to zero, rather than small accuracy drops).
    Non-finite values that appear only in the candidate always fail.
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
        """JSON-ready form."""
        return {"atol": self.atol, "rtol": self.rtol, "elementwise": self.elementwise, "max_error": self.max_error,
                "min_topk_agreement": self.min_topk_agreement, "topk": self.topk, "min_cosine": self.min_cosine}


@dataclass
class GateCheck:
    """One criterion of the spec: its threshold, the measured value and whether it holds."""

    name: str
    threshold: float | None
    value: float | None
    passed: bool
    detail: str = ""

    def to_dict(self) -> dict:
        """JSON-ready form (infinities as text)."""
        return {"name": self.name, "threshold": _num(self.threshold), "value": _num(self.value),
                "passed": self.passed, "detail": self.detail}


@dataclass
class GateResult:
    """The verdict: passed when every check holds; the comparison it was made on, as a dict."""

    passed: bool
    checks: list[GateCheck]
    comparison: dict = field(default_factory=dict)
    #: Largest absolute error and worst top-k agreement over the outputs, for tables.
    max_abs: float | None = None
    topk_agreement: float | None = None

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"passed": self.passed, "checks": [c.to_dict() for c in self.checks], "max_abs": _num(self.max_abs),
                "topk_agreement": _num(self.topk_agreement), "comparison": self.comparison}


def evaluate(comparison: CompareResult, spec: GateSpec) -> GateResult:
    """Apply ``spec`` to a compare result: the finite check always, then the criteria the spec asks for."""
    outputs = list(comparison.outputs)
    checks = [_finite(outputs)]
    if comparison.missing:
        missing = list(comparison.missing)
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
        checks.append(_topk_check(spec, worst))
    if spec.min_cosine is not None:
        low = min((o.cosine for o in outputs), default=1.0)
        low = -1.0 if math.isnan(low) else low
        checks.append(GateCheck("cosine", spec.min_cosine, low, low >= spec.min_cosine,
                                "cosine similarity with the reference, worst output"))
    return GateResult(all(c.passed for c in checks), checks, comparison.to_dict(), max_abs, worst)


def _finite(outputs: list) -> GateCheck:
    new_special = [o.name for o in outputs if o.nan[1] > o.nan[0] or o.inf[1] > o.inf[0]]
    return GateCheck("finite", None, float(len(new_special)), not new_special,
                     f"NaN/Inf only in the optimized model: {', '.join(new_special)}" if new_special
                     else "no new NaN/Inf")


def _topk_check(spec: GateSpec, worst: float | None) -> GateCheck:
    if worst is None:
        return GateCheck("topk_agreement", spec.min_topk_agreement, None, False,
                         "no classifier-like output ([N, C] float) to measure top-k agreement on; "
                         "use --max-error instead")
    return GateCheck("topk_agreement", spec.min_topk_agreement, worst, worst >= spec.min_topk_agreement,
                     f"top-{spec.topk} agreement, worst output")


def _agreement(topk: TopKAgreement, k: int) -> float:
    return float(topk.top1 if k == 1 else topk.topk_overlap)


def _num(value: float | None):
    if value is None or math.isfinite(value):
        return value
    return str(value)
