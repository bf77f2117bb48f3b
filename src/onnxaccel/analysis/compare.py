"""Compare two sets of outputs (a reference and a candidate) and decide pass or fail against tolerances.

An element passes when ``|candidate - reference| <= atol + rtol * |reference|`` (numpy.isclose's rule, the
one Polygraphy's default "elemwise" check uses). NaN matches NaN and an infinity matches the same
infinity; any other non-finite value, or one that appears only in the candidate, fails. Error statistics
are computed over the positions where both values are finite.

``compare_targets`` runs one model on two targets with the same feeds and compares what comes out;
running lives in the pipeline, comparing here (after Polygraphy, which keeps the two apart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.model import Model
from onnxaccel.target import Target

SCHEMA = "onnxaccel.compare/1"

#: Default (atol, rtol) by the lowest precision in the pair. FP32 leaves room for TF32, which the CUDA EP
#: enables by default (use_tf32, cuda_execution_provider_info.h, ORT 1.18+); FP16 for half-precision
#: rounding through a deep network; INT8 for quantization noise. Override with --atol/--rtol.
DEFAULT_TOLERANCES = {"fp32": (1e-4, 1e-3), "fp16": (1e-2, 5e-2), "int8": (5e-2, 1e-1)}


CPU_FP16_NOTE = ("On the CPU provider ONNX Runtime runs most FP16 ops in FP32, inserting Casts around ops that "
                 "lack FP16 kernels (insert_cast_transformer.cc), so cpu/fp16 shows the effect of FP16 weights "
                 "(and of FP16 storage where the runtime keeps it), not of FP16 arithmetic; a GPU target shows that.")


@dataclass(frozen=True)
class TopKAgreement:
    k: int
    rows: int
    #: Fraction of rows whose best class is the same in both.
    top1: float
    #: Mean fraction of the reference's k best classes that the candidate also ranks in its k best.
    topk_overlap: float

    def to_dict(self) -> dict:
        return {"k": self.k, "rows": self.rows, "top1": self.top1, "topk_overlap": self.topk_overlap}


@dataclass(frozen=True)
class OutputComparison:
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
    outputs: tuple[OutputComparison, ...]
    atol: float
    rtol: float
    #: Output names present on one side only.
    missing: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.missing and all(o.passed for o in self.outputs)

    @property
    def failed(self) -> tuple[OutputComparison, ...]:
        return tuple(o for o in self.outputs if not o.passed)

    def to_dict(self) -> dict:
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
    ref, cand = np.asarray(ref), np.asarray(cand)
    base = dict(name=name, shape=list(ref.shape), candidate_shape=list(cand.shape), dtype=ref.dtype.name,
                candidate_dtype=cand.dtype.name)
    if ref.shape != cand.shape:
        return OutputComparison(**base, max_abs=float("nan"), mean_abs=float("nan"), max_rel=float("nan"),
                                mean_rel=float("nan"), rel_l2=float("inf"), cosine=float("nan"), nan=(0, 0),
                                inf=(0, 0),
                                mismatched=int(ref.size), size=int(ref.size), required_atol=float("inf"), topk=None,
                                passed=False, reason=f"shapes differ: {list(ref.shape)} vs {list(cand.shape)}")
    a = ref.astype(np.float64)
    b = cand.astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    same_special = ~finite & ((np.isnan(a) & np.isnan(b)) | (a == b))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(finite, np.abs(a - b), 0.0)
    allowed = atol + rtol * np.abs(np.where(finite, a, 0.0))
    bad = (finite & (diff > allowed)) | (~finite & ~same_special)
    mismatched = int(bad.sum())
    d = diff[finite]
    nonzero = finite & (a != 0)
    rel = diff[nonzero] / np.abs(a[nonzero])
    excess = (diff - rtol * np.abs(np.where(finite, a, 0.0)))[finite]
    counts_nan = (int(np.isnan(a).sum()), int(np.isnan(b).sum()))
    counts_inf = (int(np.isinf(a).sum()), int(np.isinf(b).sum()))
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
        nan=counts_nan, inf=counts_inf, mismatched=mismatched, size=int(ref.size),
        required_atol=float(max(0.0, excess.max())) if excess.size and not (~finite & ~same_special).any()
        else float("inf"),
        topk=_topk(ref, cand, topk),
        passed=mismatched == 0, reason=reason,
    )


def check_tolerances(atol: float, rtol: float) -> None:
    from onnxaccel.errors import UsageError

    for label, value in (("atol", atol), ("rtol", rtol)):
        if not np.isfinite(value) or value < 0:
            raise UsageError(f"--{label} must be a finite number >= 0, got {value}.",
                             f"e.g. --{label} {DEFAULT_TOLERANCES['fp16'][0 if label == 'atol' else 1]:g}")


def default_tolerances(*targets: Target) -> tuple[float, float]:
    """The loosest default among the targets' precisions (see DEFAULT_TOLERANCES)."""
    pairs = [DEFAULT_TOLERANCES.get(t.precision, DEFAULT_TOLERANCES["fp32"]) for t in targets]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


@dataclass
class TargetRun:
    target: str
    providers: list[str]
    placement: dict
    compile_seconds: float
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"target": self.target, "providers": self.providers, "placement": self.placement,
                "compile_seconds": self.compile_seconds, "warnings": self.warnings}


@dataclass
class TargetComparison:
    """The result of ``compare_targets``: both runs and the comparison of their outputs."""

    model: str
    reference: TargetRun
    candidate: TargetRun
    input_shapes: dict[str, list[int]]
    result: CompareResult
    notes: list[str] = field(default_factory=list)
    feeds: dict[str, np.ndarray] = field(repr=False, default_factory=dict)
    bound_model: Model | None = field(repr=False, default=None)

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "model": self.model, "reference": self.reference.to_dict(),
                "candidate": self.candidate.to_dict(), "input_shapes": self.input_shapes,
                **self.result.to_dict(), "notes": self.notes}


def compare_targets(
    source: str | Model,
    reference: Target,
    candidate: Target,
    *,
    atol: float,
    rtol: float,
    topk: int = 5,
    inputs: Sequence[str] = (),
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    seed: int = 0,
    strict: bool = False,
    value_ranges: Mapping[str, tuple[float, float]] | None = None,
) -> TargetComparison:
    """Run the model on both targets with the same feeds and compare the outputs."""
    from onnxaccel.pipeline import prepare

    check_tolerances(atol, rtol)
    first = prepare(source, reference, inputs=inputs, shapes=shapes, batch=batch, seed=seed, strict=strict,
                    value_ranges=value_ranges)
    try:
        ref_out = first.run()  # a failure names the synthesized inputs (pipeline.explain_failure)
        ref_run = _target_run(first)
    finally:
        first.close()
    second = prepare(first.model, candidate, inputs=inputs, shapes=shapes, batch=batch, seed=seed, strict=strict)
    try:
        cand_out = second.runner.run(first.feeds)
        cand_run = _target_run(second)
    finally:
        second.close()
    return TargetComparison(
        model=str(source) if not isinstance(source, Model) else source.source,
        reference=ref_run, candidate=cand_run,
        input_shapes={k: list(v) for k, v in first.model.input_shapes.items()},
        result=compare_outputs(ref_out, cand_out, atol=atol, rtol=rtol, topk=topk),
        notes=[CPU_FP16_NOTE] if any(t.device == "cpu" and t.precision == "fp16" for t in (reference, candidate))
        else [],
        feeds=first.feeds, bound_model=first.model,
    )


def _target_run(prepared) -> TargetRun:
    runner = prepared.runner
    return TargetRun(str(prepared.target), list(runner.providers), runner.placement.to_dict(),
                     runner.compile_seconds, list(prepared.warnings))


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
