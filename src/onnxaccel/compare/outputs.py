"""Compare two sets of outputs (a reference and a candidate): error metrics per output and pass or fail.

Pass/fail is :func:`onnxaccel.compare.elementwise.elementwise`'s rule. Beside it each output gets the figures
that tell *how* it differs: largest and mean absolute and relative error, the relative L2 error of the tensor
as a whole, cosine similarity, NaN/Inf counts on each side, the smallest atol that would pass, and for
classifier-like outputs ([N, C]) the top-k agreement of the two. The ``compare`` command, the accuracy gate of
``optimize``, ``bench``/``tune``'s accuracy column and ``bisect`` all read these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from onnxaccel.compare.elementwise import elementwise
from onnxaccel.errors import UsageError
from onnxaccel.target import Target

#: Default (atol, rtol) by the lowest precision in the pair. FP32 leaves room for TF32, which the CUDA EP
#: enables by default (use_tf32, cuda_execution_provider_info.h, ORT 1.18+); FP16 for half-precision
#: rounding through a deep network; INT8 for quantization noise. Override with --atol/--rtol.
DEFAULT_TOLERANCES = {"fp32": (1e-4, 1e-3), "fp16": (1e-2, 5e-2), "int8": (5e-2, 1e-1)}


@dataclass(frozen=True)
class TopKAgreement:
    """How far two classifier-like outputs ([N, C]) agree on the best classes of each row."""

    k: int
    rows: int
    #: Fraction of rows whose best class is the same in both.
    top1: float
    #: Mean fraction of the reference's k best classes that the candidate also ranks in its k best.
    topk_overlap: float

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"k": self.k, "rows": self.rows, "top1": self.top1, "topk_overlap": self.topk_overlap}


@dataclass(frozen=True)
class OutputComparison:
    """One output compared: its error figures and whether it passes at the given atol and rtol."""

    name: str
    shape: list[int]
    candidate_shape: list[int]
    dtype: str
    candidate_dtype: str
    max_abs: float
    mean_abs: float
    max_rel: float
    mean_rel: float
    #: ||candidate - reference|| / ||reference|| over the finite positions: the error of the tensor as a whole.
    rel_l2: float
    cosine: float
    nan: tuple[int, int]
    inf: tuple[int, int]
    mismatched: int
    size: int
    #: The smallest atol with which this output would pass at the given rtol.
    required_atol: float
    topk: TopKAgreement | None
    passed: bool
    reason: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready form (NaN/Inf counts as {"reference", "candidate"})."""
        return {
            "name": self.name, "shape": self.shape, "candidate_shape": self.candidate_shape, "dtype": self.dtype,
            "candidate_dtype": self.candidate_dtype, "max_abs": self.max_abs, "mean_abs": self.mean_abs,
            "max_rel": self.max_rel, "mean_rel": self.mean_rel, "rel_l2": self.rel_l2, "cosine": self.cosine,
            "nan": {"reference": self.nan[0], "candidate": self.nan[1]},
            "inf": {"reference": self.inf[0], "candidate": self.inf[1]},
            "mismatched": self.mismatched, "size": self.size, "required_atol": self.required_atol,
            "topk": self.topk.to_dict() if self.topk else None, "passed": self.passed, "reason": self.reason,
        }


@dataclass(frozen=True)
class CompareResult:
    """Every shared output compared; outputs present on one side only make it fail."""

    outputs: tuple[OutputComparison, ...]
    atol: float
    rtol: float
    #: Output names present on one side only.
    missing: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        """No output missing on either side and every shared output within tolerance."""
        return not self.missing and all(o.passed for o in self.outputs)

    @property
    def failed(self) -> tuple[OutputComparison, ...]:
        """The outputs that do not pass."""
        return tuple(o for o in self.outputs if not o.passed)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"passed": self.passed, "atol": self.atol, "rtol": self.rtol, "missing": list(self.missing),
                "outputs": [o.to_dict() for o in self.outputs]}


def compare_outputs(
    reference: Mapping[str, np.ndarray],
    candidate: Mapping[str, np.ndarray],
    *,
    atol: float,
    rtol: float,
    topk: int = 5,
) -> CompareResult:
    """Compare every output the two share; outputs present on one side only make the result fail."""
    check_tolerances(atol, rtol)
    names = [n for n in reference if n in candidate]
    missing = tuple(sorted(set(reference) ^ set(candidate)))
    return CompareResult(tuple(compare_array(n, reference[n], candidate[n], atol=atol, rtol=rtol, topk=topk)
                               for n in names), atol, rtol, missing)


def compare_array(name: str, ref: np.ndarray, cand: np.ndarray, *, atol: float, rtol: float, topk: int = 5
                  ) -> OutputComparison:
    """Compare one output: the element-wise rule for pass/fail, and every error figure of OutputComparison."""
    ref, cand = np.asarray(ref), np.asarray(cand)
    base = dict(name=name, shape=list(ref.shape), candidate_shape=list(cand.shape), dtype=ref.dtype.name,
                candidate_dtype=cand.dtype.name)
    if ref.shape != cand.shape:
        return OutputComparison(**base, max_abs=float("nan"), mean_abs=float("nan"), max_rel=float("nan"),
                                mean_rel=float("nan"), rel_l2=float("inf"), cosine=float("nan"), nan=(0, 0),
                                inf=(0, 0),
                                mismatched=int(ref.size), size=int(ref.size), required_atol=float("inf"), topk=None,
                                passed=False, reason=f"shapes differ: {list(ref.shape)} vs {list(cand.shape)}")
    # Plain astype, not elementwise.as_float64: a complex output keeps its historical real-part comparison here.
    a = ref.astype(np.float64)
    b = cand.astype(np.float64)
    rule = elementwise(a, b, atol=atol, rtol=rtol)
    finite, diff, mismatched = rule.finite, rule.diff, rule.mismatched
    d = diff[finite]
    nonzero = finite & (a != 0)
    rel = diff[nonzero] / np.abs(a[nonzero])
    excess = (diff - rtol * np.abs(np.where(finite, a, 0.0)))[finite]
    reason = None
    if mismatched:
        new_special = int((~np.isfinite(b) & np.isfinite(a)).sum())
        reason = (f"{new_special} NaN/Inf value(s) appear only in the candidate" if new_special else
                  f"{mismatched} of {ref.size} element(s) outside atol={atol:g} + rtol={rtol:g}*|reference|")
    return OutputComparison(
        **base,
        max_abs=float(d.max()) if d.size else 0.0,
        mean_abs=float(d.mean()) if d.size else 0.0,
        max_rel=float(rel.max()) if rel.size else 0.0,
        mean_rel=float(rel.mean()) if rel.size else 0.0,
        rel_l2=_rel_l2(a[finite], b[finite]),
        cosine=_cosine(a[finite], b[finite]),
        nan=(int(np.isnan(a).sum()), int(np.isnan(b).sum())),
        inf=(int(np.isinf(a).sum()), int(np.isinf(b).sum())),
        mismatched=mismatched, size=int(ref.size),
        required_atol=float(max(0.0, excess.max())) if excess.size and not rule.special_bad.any()
        else float("inf"),
        topk=_topk(ref, cand, topk),
        passed=mismatched == 0, reason=reason,
    )


def check_tolerances(atol: float, rtol: float) -> None:
    """Refuse a negative or non-finite tolerance with the option to fix (--atol/--rtol)."""
    for label, value in (("atol", atol), ("rtol", rtol)):
        if not np.isfinite(value) or value < 0:
            raise UsageError(f"--{label} must be a finite number >= 0, got {value}.",
                             f"e.g. --{label} {DEFAULT_TOLERANCES['fp16'][0 if label == 'atol' else 1]:g}")


def default_tolerances(*targets: Target) -> tuple[float, float]:
    """The loosest default among the targets' precisions (see DEFAULT_TOLERANCES)."""
    pairs = [DEFAULT_TOLERANCES.get(t.precision, DEFAULT_TOLERANCES["fp32"]) for t in targets]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def _rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    na, nd = float(np.linalg.norm(a)), float(np.linalg.norm(a - b))
    if na == 0.0:
        return 0.0 if nd == 0.0 else float("inf")
    return nd / na


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a.ravel(), b.ravel()) / (na * nb))


def _topk(ref: np.ndarray, cand: np.ndarray, k: int) -> TopKAgreement | None:
    """Top-k agreement for classifier-like outputs: float, [N, C] once singleton axes (other than N) go."""
    if k <= 0 or ref.dtype.kind != "f" or ref.ndim < 2:
        return None
    squeezed = (ref.shape[0],) + tuple(d for d in ref.shape[1:] if d != 1)
    if len(squeezed) != 2 or squeezed[1] < 2:
        return None
    r = ref.reshape(squeezed).astype(np.float64)
    c = cand.reshape(squeezed).astype(np.float64)
    k = min(k, squeezed[1])
    r_top = np.argsort(-r, axis=1, kind="stable")[:, :k]
    c_top = np.argsort(-c, axis=1, kind="stable")[:, :k]
    top1 = float(np.mean(r_top[:, 0] == c_top[:, 0]))
    overlap = float(np.mean([len(set(x) & set(y)) / k for x, y in zip(r_top, c_top)]))
    return TopKAgreement(k, int(squeezed[0]), top1, overlap)
