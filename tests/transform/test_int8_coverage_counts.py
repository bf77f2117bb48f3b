"""The INT8 coverage summary counts one population: quantized compute nodes among the compute nodes.

QDQ form feeds many non-compute nodes (Add, Mul, Relu...) from DequantizeLinear; they count toward the shares of
FLOPs and weights but not toward "N of M compute nodes". tests/transform/test_int8_magika_packaged.py checks it on
a packaged model.
"""

from __future__ import annotations

import re

from onnxaccel.transform.int8_coverage import Int8Coverage


def test_summary_counts_quantized_compute_nodes_of_compute_nodes():
    coverage = Int8Coverage(["conv", "add", "mul", "gemm", "relu"], 3, 0.9, 1.0, ["conv", "gemm"])
    summary = coverage.describe()
    quantized, total = map(int, re.search(r"\((\d+) of (\d+) compute nodes", summary).groups())
    assert (quantized, total) == (2, 3), summary
    assert ": conv, gemm; 3 other nodes quantized)" in summary, summary
    data = coverage.to_dict()
    assert data["quantized_nodes"] == ["conv", "add", "mul", "gemm", "relu"]
    assert data["quantized_compute_nodes"] == ["conv", "gemm"] and data["compute_nodes"] == 3


def test_summary_without_other_quantized_nodes_names_only_compute_nodes():
    summary = Int8Coverage(["head"], 54, 0.0001, 0.004, ["head"]).describe()
    assert summary.endswith("(1 of 54 compute nodes: head)"), summary
