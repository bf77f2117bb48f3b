"""The comparator: ONNX's allclose rule and tolerances per element type, sequences, optionals, strings."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onnxaccel.compare.tolerance import ONNX_ATOL, ONNX_RTOL, TolerancePolicy, check_array, compare_value

FP32 = TolerancePolicy()


def one(expected, actual, policy=FP32):
    (check,) = compare_value("y", expected, actual, policy)
    return check


def test_float32_uses_onnx_backend_defaults_and_reports_the_error_numbers():
    assert FP32.for_dtype(np.dtype("float32")).rtol == ONNX_RTOL == 1e-3
    assert FP32.for_dtype(np.dtype("float32")).atol == ONNX_ATOL == 1e-7
    expected = np.array([1.0, 2.0, 4.0, 100.0], np.float32)
    assert one(expected, expected * (1 + 5e-4)).passed
    bad = expected.copy()
    bad[3] += 1.0
    check = one(expected, bad)
    assert not check.passed and check.mismatched == 1 and check.size == 4
    assert check.max_abs == pytest.approx(1.0) and check.max_rel == pytest.approx(0.01)


def test_nan_equals_nan_and_infinities_must_match_in_sign():
    expected = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert one(expected, expected.copy()).passed
    check = one(expected, np.array([np.nan, -np.inf, -np.inf, 1.0], np.float32))
    assert not check.passed and check.mismatched == 1
    assert not one(expected, np.array([0.0, np.inf, -np.inf, 1.0], np.float32)).passed


def test_integers_booleans_and_strings_must_be_equal():
    assert not one(np.array([1, 2], np.int64), np.array([1, 3], np.int64)).passed
    assert one(np.array([True, False]), np.array([True, False])).passed
    assert one(np.array([b"ab", b"c"], object), np.array(["ab", "c"], object)).passed
    assert not one(np.array(["ab", "c"], object), np.array(["ab", "d"], object)).passed


def test_shape_and_dtype_mismatch_fail_with_the_reason():
    assert "shape" in one(np.zeros((2, 1), np.float32), np.zeros(2, np.float32)).reason
    assert "dtype" in one(np.zeros(2, np.float32), np.zeros(2, np.float64)).reason


def test_bfloat16_gets_two_ulps_as_onnx_runner_gives_it():
    assert FP32.for_dtype(np.dtype(ml_dtypes.bfloat16)).rtol == 2 ** -6
    expected = np.array([1.0, 3.0], ml_dtypes.bfloat16)
    actual = (expected.astype(np.float32) * (1 + 2 ** -7)).astype(ml_dtypes.bfloat16)
    assert one(expected, actual).passed


def test_fp16_precision_is_looser_and_the_user_override_wins():
    fp16 = TolerancePolicy(precision="fp16")
    tol = fp16.for_dtype(np.dtype("float32"))
    assert (tol.rtol, tol.atol) == (1e-2, 1e-3)
    expected = np.array([1.0, 10.0], np.float32)
    assert one(expected, expected * 1.005, fp16).passed and not one(expected, expected * 1.005).passed
    user = TolerancePolicy(precision="fp16", rtol=0.0, atol=0.01)
    assert user.for_dtype(np.dtype("float32")).rtol == 0.0
    assert not one(expected, expected * 1.005, user).passed
    # the case's own data.json tolerances replace ONNX's defaults, user overrides still win
    case = TolerancePolicy().for_case(0.1, None)
    assert case.for_dtype(np.dtype("float32")).rtol == 0.1


def test_sequences_compare_element_by_element_and_by_length():
    expected = [np.array([1.0], np.float32), np.array([2.0, 3.0], np.float32)]
    checks = compare_value("seq", expected, [e.copy() for e in expected], FP32)
    assert [c.name for c in checks] == ["seq[0]", "seq[1]"] and all(c.passed for c in checks)
    (short,) = compare_value("seq", expected, expected[:1], FP32)
    assert not short.passed and "length" in short.reason
    assert not compare_value("seq", expected, np.zeros(2), FP32)[0].passed


def test_optionals_compare_presence_then_value():
    assert one(None, None).passed
    assert not one(None, np.zeros(1, np.float32)).passed
    assert not one(np.zeros(1, np.float32), None).passed


def test_nan_outputs_are_named_in_the_summary_not_reported_as_max_abs_zero():
    # An FP16 overflow on a GPU read "1000/1000 off, max abs 0, rel 0": every value NaN, no finite error.
    policy = TolerancePolicy()
    check = check_array("prob", np.full(1000, 0.001, np.float32), np.full(1000, np.nan, np.float32), policy)
    assert not check.passed and check.mismatched == 1000
    assert "1000 NaN/Inf element(s) differ" in check.summary()


def test_fp16_error_near_zero_is_judged_against_the_tensors_largest_value():
    expected = np.array([1.0, -1.0, 0.002], dtype=np.float32)
    actual = np.array([1.0, -1.0, 0.006], dtype=np.float32)  # 4e-3 off: 4 float16 ULPs of 1.0
    fp16 = check_array("grid", expected, actual, TolerancePolicy(precision="fp16"))
    assert fp16.passed
    assert not check_array("grid", expected, actual, TolerancePolicy()).passed
    far = check_array("grid", expected, np.array([1.0, -1.0, 0.02], dtype=np.float32),
                      TolerancePolicy(precision="fp16"))
    assert not far.passed and "atol=0.0078125" in far.reason


def test_fp16_quantized_outputs_may_be_one_step_away_and_no_more():
    expected = np.array([0, 128, 255], dtype=np.uint8)
    policy = TolerancePolicy(precision="fp16")
    assert check_array("y", expected, np.array([0, 129, 255], dtype=np.uint8), policy).passed
    two = check_array("y", expected, np.array([0, 130, 255], dtype=np.uint8), policy)
    assert not two.passed and "more than 1 step" in two.reason
    assert not check_array("y", expected, np.array([0, 129, 255], dtype=np.uint8), TolerancePolicy()).passed
    indices = np.array([3, 4], dtype=np.int64)  # an index is exact even at FP16: one off is another class
    assert not check_array("i", indices, indices + 1, policy).passed
