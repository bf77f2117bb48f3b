"""The CI slice of the conformance run: every case plain ONNX Runtime passes must pass in `check` too.

A few hundred of ONNX's own cases -- every 6th node case, all of 'simple' and 'pytorch-operator', and one
'real' model -- run through plain ONNX Runtime (benchmarks/conformance.py's reference) and through
`check` on the CPU. This guards the defects of issue 17 (scalars reshaped, string/bool/bf16 inputs refused,
sequence/optional inputs unbound): each made cases that plain ONNX Runtime passes fail here.
"""

from __future__ import annotations

from onnxaccel.conformance import discover, run_check
from onnxaccel.target import parse_target

NODE_EVERY = 6


def test_every_case_plain_onnx_runtime_passes_passes_in_check(node_dir, onnx_data, benchmark_module):
    nodes = discover([node_dir])[::NODE_EVERY]
    cases = nodes + discover([onnx_data / "simple", onnx_data / "pytorch-operator",
                              onnx_data / "real" / "test_squeezenet"])
    assert len(cases) >= 300
    target = parse_target("cpu")
    reference = {c.name: benchmark_module.ort_reference(c, target)["status"] for c in cases}
    report = run_check(cases, target)
    regressions = [(r.name, r.status, r.detail()) for r in report.cases
                   if reference[r.name] == "pass" and r.status != "pass"]
    assert not regressions
    assert sum(s == "pass" for s in reference.values()) > 250
