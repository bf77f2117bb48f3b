"""One element-wise rule beneath every feature: `compare`/the accuracy gate/bench (compare_array) and `check`
(check_array) decide pass or fail on the same elements, NaN and Inf included, and the gate's verdict reads it."""

from __future__ import annotations

import numpy as np
import pytest

from onnxaccel.compare import (
    GateSpec, TolerancePolicy, as_float64, check_array, compare_array, compare_outputs, elementwise, evaluate,
)

#: Reference, candidate: near zero, relative error, sign of an infinity, NaN on one or both sides.
REFERENCE = np.array([0.0, 1e-6, 1.0, 100.0, -100.0, np.inf, -np.inf, np.nan, np.nan, 5.0, 2.0], np.float32)
CANDIDATE = np.array([2e-5, 0.0, 1.0009, 100.2, -100.05, np.inf, np.inf, np.nan, 1.0, np.inf, np.nan], np.float32)


@pytest.mark.parametrize("atol,rtol", [(0.0, 0.0), (1e-5, 1e-3), (1e-4, 2e-3), (1.0, 0.1)])
def test_compare_and_check_fail_the_same_elements(atol, rtol):
    rule = elementwise(as_float64(REFERENCE), as_float64(CANDIDATE), atol=atol, rtol=rtol)
    metrics = compare_array("y", REFERENCE, CANDIDATE, atol=atol, rtol=rtol)
    conformance = check_array("y", REFERENCE, CANDIDATE, TolerancePolicy(rtol=rtol, atol=atol))
    assert metrics.mismatched == conformance.mismatched == rule.mismatched
    # Non-finite mismatches whatever the tolerance: -inf vs inf, NaN vs 1, inf where 5 was, NaN where 2 was.
    assert int(rule.special_bad.sum()) == 4
    assert metrics.max_abs == pytest.approx(conformance.max_abs)


def test_the_rule_is_numpys_isclose_on_finite_elements():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal(1000)
    cand = ref + rng.standard_normal(1000) * 1e-3
    rule = elementwise(ref, cand, atol=1e-4, rtol=1e-3)
    assert np.array_equal(~rule.bad, np.isclose(cand, ref, atol=1e-4, rtol=1e-3))


def test_the_gate_judges_what_compare_measured():
    reference = {"logits": np.array([[1.0, 2.0, 3.0]], np.float32)}
    swapped = {"logits": np.array([[1.0, 3.0, 2.0]], np.float32)}  # top-1 changes, error 1.0
    spec = GateSpec(atol=1e-3, rtol=1e-3, elementwise=False, max_error=2.0, min_topk_agreement=1.0)
    verdict = evaluate(compare_outputs(reference, swapped, atol=spec.atol, rtol=spec.rtol), spec)
    assert not verdict.passed
    assert {c.name: c.passed for c in verdict.checks} == {"finite": True, "max_error": True,
                                                            "topk_agreement": False}
