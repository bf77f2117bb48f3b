"""ONNX conformance: run ONNX test-case folders (model.onnx + test_data_set_N/*.pb) on a target and compare
every output with the expected one. `onnxaccel check` renders it."""

from onnxaccel.compare.tolerance import OutputCheck, Tolerance, TolerancePolicy, compare_value
from onnxaccel.conformance.cases import DataSet, TestCase, discover, read_case
from onnxaccel.conformance.result import SCHEMA, CaseResult, CheckReport
from onnxaccel.conformance.runner import run_case, run_check

__all__ = [
    "SCHEMA", "CaseResult", "CheckReport", "DataSet", "OutputCheck", "TestCase", "Tolerance", "TolerancePolicy",
    "compare_value", "discover", "read_case", "run_case", "run_check",
]
