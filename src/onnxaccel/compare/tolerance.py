"""Compare an expected ONNX value with the one a target produced, with tolerances chosen per element type.

``onnxaccel check`` (the ``conformance`` feature) judges ONNX test cases with this. A float element passes
when ``|actual - expected| <= atol + rtol * |expected|``: the rule of ``numpy.testing.assert_allclose``, which
ONNX's backend test runner applies to every output (onnx/onnx, onnx/backend/test/runner/__init__.py
``assert_similar_outputs``, release 1.23.0), applied by :func:`onnxaccel.compare.elementwise.elementwise`.
NaN equals NaN and an infinity equals the same infinity (assert_allclose's ``equal_nan=True``). Integers,
booleans and strings must be equal. Sequences compare element by element, optionals by presence then value,
maps by key then value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxaccel.compare.elementwise import as_float64, elementwise

#: ONNX's defaults for every backend test case: rtol=1e-3, atol=1e-7 (onnx/onnx, onnx/backend/test/loader/
#: __init__.py and onnx/backend/test/case/node/__init__.py ``expect``, release 1.23.0). A case folder's
#: ``data.json`` may give its own {"rtol", "atol"}, as ONNX's loader reads it.
ONNX_RTOL = 1e-3
ONNX_ATOL = 1e-7

#: Mantissa bits of the low-precision float types (ml_dtypes' names).
_MANTISSA_BITS = {
    "float16": 10, "bfloat16": 7, "float8_e4m3fn": 3, "float8_e4m3fnuz": 3, "float8_e5m2": 2,
    "float8_e5m2fnuz": 2, "float8_e8m0fnu": 0, "float4_e2m1fn": 1,
}
#: The least rtol of a narrow float output. ONNX's own runner applies the case's rtol (default 1e-3) to every
#: output and widens it only for bfloat16, to two bfloat16 ULPs, ``max(rtol, 2**-6)`` (onnx/onnx,
#: onnx/backend/test/runner/__init__.py ``assert_similar_outputs``, release 1.23.0; the installed 1.23.2 is the
#: same): float8 outputs get no widening there, so 1e-3 asks them to be equal. float16 and bfloat16 keep two
#: ULPs here (2**-(bits - 1)), bfloat16 as ONNX's runner does. The float8 types get one ULP, 2**-bits: a value
#: rounded to the neighbour on the other side of the exact result passes, while 2**-(bits - 1) (0.25 for e4m3,
#: 0.5 for e5m2, 2.0 for e8m0) let a value twice the expected one pass. float8_e8m0fnu has
#: no mantissa bits: its values are powers of two and neighbours differ by a factor of two, so "one ULP" is
#: the whole next value; no widening (the case's rtol, < 0.5) asks for equality, and a doubled or halved value
#: fails. float4_e2m1fn keeps its two ULPs (rtol 1.0).
_NARROW_RTOL = {
    name: 2.0 ** -bits if name.startswith("float8_") else 2.0 ** -(bits - 1)
    for name, bits in _MANTISSA_BITS.items() if bits > 0
}

#: Defaults when the model ran at FP16 precision (weights and compute converted, FP32 inputs and outputs kept):
#: rtol 1e-2 is about ten float16 ULPs (2**-10 each), room for rounding that accumulates over a few
#: ops; atol 1e-3 is the elementwise atol of ``migraphx-driver verify`` (ROCm/AMDMIGraphX, docs/driver.rst,
#: "--atol ... Default: 0.001"), so small values near zero do not fail on relative error alone.
FP16_RTOL = 1e-2
FP16_ATOL = 1e-3
#: At FP16 precision an element's error also scales with the largest value of its tensor: a sum or difference
#: of terms of that size (a grid coordinate, a normalised score) carries their float16 rounding even when the
#: result is near zero. Allowed: 8 float16 ULPs of the tensor's largest magnitude, 2**-7 * max|expected|
#: (the float16 ULP at x is 2**-10 * x). Seen in ONNX's AffineGrid and LinearAttention cases (4-5e-3 on
#: values in [-1, 1]).
FP16_RANGE_RTOL = 2.0 ** -7
#: At FP16 precision a quantized 8-bit output (DynamicQuantizeLinear, QuantizeLinear) may land one step away:
#: its scale and zero point were computed in float16, so a value near a rounding boundary rounds the other way.
FP16_QUANT_STEP = 1


@dataclass(frozen=True)
class Tolerance:
    """The tolerance of one comparison; ``exact`` for integers, booleans and strings."""

    rtol: float
    atol: float
    exact: bool = False
    #: Adds ``range_rtol * max|expected|`` of the whole tensor to atol (FP16 precision only).
    range_rtol: float = 0.0
    #: For exact (integer) outputs: the largest difference that still passes (0: equal).
    steps: int = 0

    def to_dict(self) -> dict:
        """JSON-ready form; range_rtol and steps only when they apply."""
        out = {"rtol": self.rtol, "atol": self.atol, "exact": self.exact}
        if self.range_rtol:
            out["range_rtol"] = self.range_rtol
        if self.steps:
            out["steps"] = self.steps
        return out


@dataclass(frozen=True)
class TolerancePolicy:
    """How tolerances are chosen: the case's own (data.json) or ONNX's defaults, widened for narrow float
    types and for FP16 precision; ``rtol``/``atol`` given by the user replace them for every float output."""

    precision: str = "fp32"
    rtol: float | None = None
    atol: float | None = None
    case_rtol: float = ONNX_RTOL
    case_atol: float = ONNX_ATOL

    def for_case(self, rtol: float | None, atol: float | None) -> TolerancePolicy:
        """This policy with a case's own (data.json) rtol/atol, ONNX's defaults where the case gives none."""
        return TolerancePolicy(self.precision, self.rtol, self.atol,
                               ONNX_RTOL if rtol is None else rtol, ONNX_ATOL if atol is None else atol)

    def for_dtype(self, dtype: np.dtype) -> Tolerance:
        """The tolerance for an output of element type ``dtype`` under this policy."""
        if not is_float(dtype):
            quantized = self.precision == "fp16" and dtype.kind in "iu" and dtype.itemsize == 1
            return Tolerance(0.0, 0.0, exact=True, steps=FP16_QUANT_STEP if quantized else 0)
        rtol, atol = self.case_rtol, self.case_atol
        rtol = max(rtol, _NARROW_RTOL.get(dtype.name, 0.0))
        range_rtol = 0.0
        if self.precision == "fp16":
            rtol, atol = max(rtol, FP16_RTOL), max(atol, FP16_ATOL)
            range_rtol = FP16_RANGE_RTOL if self.atol is None else 0.0
        return Tolerance(self.rtol if self.rtol is not None else rtol, self.atol if self.atol is not None else atol,
                         range_rtol=range_rtol)


def is_float(dtype: np.dtype) -> bool:
    """Float or complex, including ml_dtypes' narrow floats (bfloat16, float8, float4)."""
    return dtype.kind in "fc" or dtype.name in _MANTISSA_BITS


@dataclass(frozen=True)
class OutputCheck:
    """One output (or one element of a sequence output) compared with its expected value."""

    name: str
    passed: bool
    dtype: str
    shape: list[int] | None
    expected_dtype: str
    expected_shape: list[int] | None
    size: int
    #: Elements beyond tolerance.
    mismatched: int
    max_abs: float
    max_rel: float
    tolerance: Tolerance
    reason: str | None = None

    @property
    def worst_score(self) -> float:
        """Orders failures: any structural failure first, then by the share of mismatched elements."""
        if self.passed:
            return 0.0
        return 2.0 if self.size == 0 or self.mismatched == 0 else 1.0 + self.mismatched / max(self.size, 1)

    def summary(self) -> str:
        """One line for tables: the structural reason, or how many elements are off and by how much."""
        if self.reason and (self.mismatched == 0 or self.tolerance.exact):
            return f"{self.name}: {self.reason}"
        text = f"{self.name}: {self.mismatched}/{self.size} off, max abs {self.max_abs:.3g}, rel {self.max_rel:.3g}"
        if self.reason and "NaN/Inf" in self.reason:
            # The errors above are over finite pairs only: say that the rest are NaN/Inf, not "max abs 0".
            text += f" ({self.reason.split(';')[0]})"
        return text

    def to_dict(self) -> dict:
        """JSON-ready form (NaN figures as null)."""
        return {"name": self.name, "passed": self.passed, "dtype": self.dtype, "shape": self.shape,
                "expected_dtype": self.expected_dtype, "expected_shape": self.expected_shape, "size": self.size,
                "mismatched": self.mismatched, "max_abs": _json_float(self.max_abs),
                "max_rel": _json_float(self.max_rel), "tolerance": self.tolerance.to_dict(), "reason": self.reason}


def compare_value(name: str, expected: Any, actual: Any, policy: TolerancePolicy) -> list[OutputCheck]:
    """Compare one output; a sequence gives one check per element (``name[i]``)."""
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)):
            return [_structural(name, expected, actual, f"expected a sequence, got {_kind(actual)}")]
        if len(expected) != len(actual):
            return [_structural(name, expected, actual,
                                f"sequence length {len(actual)}, expected {len(expected)}")]
        checks = [c for i, (e, a) in enumerate(zip(expected, actual))
                  for c in compare_value(f"{name}[{i}]", e, a, policy)]
        return checks or [_structural(name, expected, actual, None)]
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            return [_structural(name, expected, actual, f"expected a map, got {_kind(actual)}")]
        if set(expected) != set(actual):
            return [_structural(name, expected, actual, "map keys differ")]
        return [c for k in expected for c in compare_value(f"{name}[{k!r}]", expected[k], actual[k], policy)]
    if expected is None or actual is None:
        reason = None if expected is None and actual is None else (
            f"expected {'no value (empty optional)' if expected is None else _kind(expected)}, got "
            f"{'no value' if actual is None else _kind(actual)}")
        return [_structural(name, expected, actual, reason)]
    return [check_array(name, np.asarray(expected), np.asarray(actual), policy)]


def check_array(name: str, expected: np.ndarray, actual: np.ndarray, policy: TolerancePolicy) -> OutputCheck:
    """Compare one tensor with the tolerance ``policy`` gives its element type (exact for non-floats)."""
    tol = policy.for_dtype(expected.dtype)
    base = dict(name=name, dtype=actual.dtype.name, shape=list(actual.shape), expected_dtype=expected.dtype.name,
                expected_shape=list(expected.shape), size=int(expected.size), tolerance=tol)
    if expected.shape != actual.shape:
        return OutputCheck(**base, passed=False, mismatched=int(expected.size), max_abs=float("nan"),
                           max_rel=float("nan"), reason=f"shape {list(actual.shape)}, expected {list(expected.shape)}")
    if expected.dtype != actual.dtype and not (_is_text(expected) and _is_text(actual)):
        return OutputCheck(**base, passed=False, mismatched=0, max_abs=float("nan"), max_rel=float("nan"),
                           reason=f"dtype {actual.dtype.name}, expected {expected.dtype.name}")
    if tol.exact:
        if tol.steps and expected.dtype.kind in "iu":
            equal = np.abs(expected.astype(np.int64) - actual.astype(np.int64)) <= tol.steps
            rule = f"more than {tol.steps} step(s) apart"
        else:
            equal = _exact_equal(expected, actual)
            rule = "differ (exact match required)"
        bad = int((~equal).sum())
        diff = _int_diff(expected, actual) if expected.dtype.kind in "iub" else float("nan")
        return OutputCheck(**base, passed=bad == 0, mismatched=bad, max_abs=diff, max_rel=float("nan"),
                           reason=f"{bad} of {expected.size} element(s) {rule}" if bad else None)
    return _check_floats(base, as_float64(expected), as_float64(actual), tol)


def _check_floats(base: dict, e: np.ndarray, a: np.ndarray, tol: Tolerance) -> OutputCheck:
    finite = np.isfinite(e) & np.isfinite(a)
    atol = tol.atol
    if tol.range_rtol and finite.any():
        atol = max(atol, tol.range_rtol * float(np.abs(e[finite]).max()))
    rule = elementwise(e, a, atol=atol, rtol=tol.rtol)
    diff, mismatched = rule.diff, rule.mismatched
    nonzero = finite & (e != 0)
    rel = diff[nonzero] / np.abs(e[nonzero]) if nonzero.any() else np.zeros(0)
    max_abs = float(diff[finite].max()) if finite.any() else 0.0
    reason = None
    if mismatched:
        special = int(rule.special_bad.sum())
        parts = [f"{special} NaN/Inf element(s) differ"] if special else []
        if mismatched > special:
            parts.append(f"{mismatched - special} of {e.size} element(s) beyond atol={atol:g} + "
                         f"rtol={tol.rtol:g}*|expected|")
        reason = "; ".join(parts)
    return OutputCheck(**base, passed=mismatched == 0, mismatched=mismatched, max_abs=max_abs,
                       max_rel=float(rel.max()) if rel.size else 0.0, reason=reason)


def _exact_equal(expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
    if _is_text(expected):
        return np.vectorize(_text, otypes=[object])(expected) == np.vectorize(_text, otypes=[object])(actual)
    return expected == actual


def _int_diff(expected: np.ndarray, actual: np.ndarray) -> float:
    if not expected.size:
        return 0.0
    return float(np.max(np.abs(expected.astype(np.float64) - actual.astype(np.float64))))


def _is_text(value: np.ndarray) -> bool:
    return value.dtype.kind in "OUS"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _structural(name: str, expected: Any, actual: Any, reason: str | None) -> OutputCheck:
    return OutputCheck(name=name, passed=reason is None, dtype=_kind(actual), shape=None,
                       expected_dtype=_kind(expected), expected_shape=None, size=0, mismatched=0,
                       max_abs=0.0, max_rel=0.0, tolerance=Tolerance(0.0, 0.0, exact=True), reason=reason)


def _kind(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return f"sequence({len(value)})"
    if isinstance(value, Mapping):
        return "map"
    return np.asarray(value).dtype.name


def _json_float(value: float) -> float | None:
    return None if value != value else value  # NaN -> null in JSON
