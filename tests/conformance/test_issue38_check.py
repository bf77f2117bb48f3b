"""Issue 38, items 17-19: case folders sharing a model file are each checked, a case without expected
outputs is skipped (not passed), and float8 outputs are held to one ULP of their type."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from onnx import numpy_helper


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", "check", *args], capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "80"}, timeout=300)


def scale_expected(case_dir, factor: float) -> None:
    """Multiply every value of the expected output_0.pb by ``factor``, keeping its element type."""
    path = case_dir / "test_data_set_0" / "output_0.pb"
    proto = numpy_helper.from_array(np.zeros(0))
    proto.ParseFromString(path.read_bytes())
    original = numpy_helper.to_array(proto)
    wrong = (original.astype(np.float32) * factor).astype(original.dtype)
    assert not np.array_equal(wrong.astype(np.float32), original.astype(np.float32))
    path.write_bytes(numpy_helper.from_array(wrong, proto.name).SerializeToString())


def test_two_case_folders_sharing_a_model_file_are_two_cases(tmp_path, onnx_data):
    good = tmp_path / "a_good"
    shutil.copytree(onnx_data / "simple" / "test_sign_model", good)
    bad = tmp_path / "b_wrong"
    shutil.copytree(good / "test_data_set_0", bad / "test_data_set_0")
    (bad / "model.onnx").symlink_to(good / "model.onnx")
    scale_expected(bad, 2.0)  # sign(x) in {-1, 0, 1}: doubled, the non-zero values are wrong
    for args in ([str(tmp_path)], [str(good), str(bad)]):
        proc = cli(*args, "-t", "cpu")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "1 passed, 1 failed, 0 errored, 0 skipped" in proc.stdout
    report = json.loads(cli(str(tmp_path), "-t", "cpu", "--json").stdout)
    assert {c["name"]: c["status"] for c in report["cases"]} == {
        f"{tmp_path.name}/a_good": "pass", f"{tmp_path.name}/b_wrong": "fail"}
    # the same folder reached twice (itself and through its parent) is still one case
    assert json.loads(cli(str(tmp_path), str(good), "-t", "cpu", "--json").stdout)["summary"]["pass"] == 1


def test_onnx_data_from_the_parent_folder_keeps_cases_that_share_a_model(onnx_data):
    from onnxaccel.conformance import discover

    each = sum(len(discover([onnx_data / suite])) for suite in ("real", "light", "simple", "pytorch-converted",
                                                                 "pytorch-operator"))
    assert len(discover([onnx_data])) == each


def test_a_case_without_expected_outputs_is_skipped_with_the_reason(case_copy, onnx_data):
    case = case_copy("simple/test_sign_model")
    for output in case.glob("test_data_set_*/output_*.pb"):
        output.unlink()
    proc = cli(str(case), "-t", "cpu", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # nothing at all was compared
    report = json.loads(proc.stdout)
    assert report["summary"] == {"pass": 0, "fail": 0, "error": 0, "skipped": 1}
    assert report["compared"] == 0 and report["passed"] is False
    (result,) = report["cases"]
    assert result["status"] == "skipped" and "nothing to compare" in result["reason"]
    text = cli(str(case), "-t", "cpu")
    assert text.returncode == 1 and "0 passed, 0 failed, 0 errored, 1 skipped" in text.stdout
    assert "nothing compared" in text.stdout and "no output_K.pb" in text.stdout
    assert "no outputs to compare" not in text.stdout
    both = cli(str(case), str(onnx_data / "simple" / "test_sign_model"), "-t", "cpu", "--json")
    assert both.returncode == 0, both.stdout + both.stderr
    assert json.loads(both.stdout)["summary"] == {"pass": 1, "fail": 0, "error": 0, "skipped": 1}


def step_expected(case_dir, ulps: int) -> None:
    """Move the expected float8 values in [1/16, 16) ``ulps`` steps away from zero (adding to the magnitude
    bits of the 8-bit code): ``ulps`` ULPs of the value's own binade."""
    path = case_dir / "test_data_set_0" / "output_0.pb"
    proto = numpy_helper.from_array(np.zeros(0))
    proto.ParseFromString(path.read_bytes())
    values = numpy_helper.to_array(proto)
    magnitude = np.abs(values.astype(np.float32))
    chosen = (magnitude >= 1 / 16) & (magnitude < 16)
    assert chosen.any()
    codes = values.view(np.uint8).copy()
    codes[chosen] += ulps
    path.write_bytes(numpy_helper.from_array(codes.view(values.dtype), proto.name).SerializeToString())


@pytest.mark.parametrize("name", ["test_cast_FLOAT_to_FLOAT8E5M2", "test_cast_FLOAT_to_FLOAT8E5M2FNUZ",
                                  "test_cast_FLOAT_to_FLOAT8E4M3FN", "test_cast_FLOAT_to_FLOAT8E4M3FNUZ"])
def test_float8_output_within_one_ulp_passes_and_two_ulps_or_doubled_fail(node_dir, tmp_path, name):
    assert cli(str(node_dir / name), "-t", "cpu").returncode == 0
    for label, change, code in (("one_ulp", lambda c: step_expected(c, 1), 0),
                                ("two_ulps", lambda c: step_expected(c, 2), 1),
                                ("doubled", lambda c: scale_expected(c, 2.0), 1)):
        case = tmp_path / label / name
        shutil.copytree(node_dir / name, case)
        change(case)
        proc = cli(str(case), "-t", "cpu", "--json")
        assert proc.returncode == code, (label, proc.stdout + proc.stderr)


def test_float8_e8m0_output_must_equal_a_doubled_value_fails(node_dir, tmp_path):
    name = "test_cast_e8m0_FLOAT_to_FLOAT8E8M0"
    assert cli(str(node_dir / name), "-t", "cpu").returncode == 0
    case = tmp_path / name
    shutil.copytree(node_dir / name, case)
    scale_expected(case, 2.0)
    proc = cli(str(case), "-t", "cpu", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)["cases"]
    assert result["status"] == "fail" and result["outputs"][0]["tolerance"]["rtol"] == 1e-3


def test_float8_tolerances_are_one_ulp_of_the_type():
    import ml_dtypes

    from onnxaccel.compare.tolerance import TolerancePolicy

    rtol = {name: TolerancePolicy().for_dtype(np.dtype(getattr(ml_dtypes, name))).rtol for name in (
        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "bfloat16")}
    assert rtol == {"float8_e4m3fn": 0.125, "float8_e4m3fnuz": 0.125, "float8_e5m2": 0.25,
                    "float8_e5m2fnuz": 0.25, "float8_e8m0fnu": 1e-3, "bfloat16": 2 ** -6}
