"""Static INT8 of Google's Magika as its PyPI wheel ships it (issue 38: a test per item on a real model).

tests/transform/test_int8_per_tensor_and_coverage.py builds a token classifier whose Gemm bias is 2-D to reach
ONNX Runtime's per-channel failure ("The truth value of an array ... is ambiguous"). Magika 1.0.3 reaches it on
its own: ORT's 'basic' graph level fuses its last MatMul + Add into a Gemm (.../Dense_1/MatMul/MatMulAddFusion)
whose bias is [1, 214]. `optimize --int8 static` then quantizes per tensor and names that node in a note; the
quantized model loads and runs.
"""

from __future__ import annotations

import json
import re

import onnx
import pytest
from typer.testing import CliRunner

RAW_NUMPY = "The truth value of an array"


@pytest.fixture(scope="module")
def magika_int8(cli_app, magika_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("magika") / "magika.int8.onnx"
    result = CliRunner().invoke(cli_app, [
        "optimize", str(magika_model), "-o", str(out), "-t", "cpu", "--int8", "static", "--calibration", "synthetic",
        "--no-compile-cache", "--json"], env={"COLUMNS": "200"})
    assert "Traceback" not in result.output, result.output
    return result, out


def test_static_int8_falls_back_per_tensor_naming_the_fused_gemm(magika_int8):
    result, out = magika_int8
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["precision"]["int8"]["mode"] == "static" and report["precision"]["int8"]["per_channel"] is False
    note = next(n for n in report["notes"] if "per tensor, not per channel" in n)
    assert "Dense_1" in note and "--per-tensor" in note  # the node, by the name ORT's fusion gives it
    # The numpy text may be quoted as the cause, never stand alone as what the user reads.
    for line in report["notes"] + report["warnings"]:
        assert not line.startswith(RAW_NUMPY), line
    assert report["accuracy"]["passed"] is True and report["accuracy"]["checks"]
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert sum(n.op_type == "DequantizeLinear" for n in model.graph.node) > 10


def test_static_int8_coverage_counts_no_more_quantized_compute_nodes_than_there_are(magika_int8):
    """Magika has three compute nodes (two MatMuls, one Conv); the coverage summary's "N of M compute nodes"
    counts the quantized ones among them, so N <= M."""
    result, _ = magika_int8
    assert result.exit_code == 0, result.output
    coverage = json.loads(result.stdout)["precision"]["coverage"]
    assert coverage["flops_share"] > 0.9 and not coverage["low"]
    found = re.search(r"\((\d+) of (\d+) compute nodes", coverage["summary"])
    assert found, coverage["summary"]
    quantized, total = map(int, found.groups())
    assert total == coverage["compute_nodes"] and 0 < quantized <= total, coverage["summary"]
