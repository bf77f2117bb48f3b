"""The one element-wise rule every comparison in onnxaccel applies, and the float64 views it works on.

An element passes when ``|candidate - reference| <= atol + rtol * |reference|``: numpy.isclose's rule, the
one Polygraphy's default "elemwise" check uses and the one ``numpy.testing.assert_allclose`` applies in ONNX's
backend test runner (onnx/onnx, onnx/backend/test/runner/__init__.py ``assert_similar_outputs``, release
1.23.0). NaN matches NaN and an infinity matches the same infinity; any other non-finite value, or one that
appears on one side only, fails. Error figures are taken over the positions where both values are finite.

``compare.outputs`` (the ``compare`` command, the accuracy gate, bench) and ``compare.tolerance`` (``check``'s
per-element-type tolerances) both decide pass/fail through :func:`elementwise`, so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Elementwise:
    """Where two arrays of one shape differ under the rule, element by element."""

    #: Both values finite: the positions error figures are taken over.
    finite: np.ndarray
    #: ``|candidate - reference|`` where both are finite, else 0.
    diff: np.ndarray
    #: Elements that fail the rule (finite ones beyond tolerance, and non-finite ones that do not match).
    bad: np.ndarray
    #: Non-finite elements that do not match (NaN or Inf on one side only, or infinities of opposite sign).
    special_bad: np.ndarray

    @property
    def mismatched(self) -> int:
        """How many elements fail."""
        return int(self.bad.sum())


def elementwise(reference: np.ndarray, candidate: np.ndarray, *, atol: float, rtol: float) -> Elementwise:
    """Apply the rule to two float64 (or complex128) arrays of the same shape (see :func:`as_float64`)."""
    finite = np.isfinite(reference) & np.isfinite(candidate)
    same_special = ~finite & ((np.isnan(reference) & np.isnan(candidate)) | (reference == candidate))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(finite, np.abs(candidate - reference), 0.0)
        allowed = atol + rtol * np.abs(np.where(finite, reference, 0.0))
    special_bad = ~finite & ~same_special
    return Elementwise(finite, diff, (finite & (diff > allowed)) | special_bad, special_bad)


def as_float64(value: np.ndarray) -> np.ndarray:
    """float64 (complex128 for complex types); ml_dtypes' narrow floats (bfloat16, float8...) go through
    float32, which holds every one of their values."""
    if value.dtype.kind == "c":
        return value.astype(np.complex128)
    if value.dtype.kind in "fiub":
        return value.astype(np.float64)
    return value.astype(np.float32).astype(np.float64)
