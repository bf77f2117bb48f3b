"""FLOP/s from a partial FLOP count (arithmetic inside If/Loop/Scan is not counted) is marked as a lower bound
wherever it is shown: bench's table, JSON and Markdown, and inspect (issue 23). Silero VAD runs its network
inside an If."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from onnxaccel.cli.main import app
from tests.model_builders import make_mlp

runner = CliRunner()
VAD = ["--shape", "input=1x512", "--shape", "state=2x1x128", "-i", "sr=16000"]
FAST = ["--runs", "3", "--warmup", "1", "--no-telemetry", "-t", "cpu"]


def test_bench_marks_flops_of_a_model_with_if_branches_as_partial(silero_vad_model, tmp_path):
    report = tmp_path / "vad.json"
    result = runner.invoke(app, ["bench", str(silero_vad_model), *VAD, *FAST, "--report", str(report),
                                 "--report", str(tmp_path / "vad.md")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    rate = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("cpu"))
    assert "≥" in rate  # the FLOP/s cell is a lower bound
    assert "FLOP/s marked ≥ are lower bounds (partial: 1 node(s) uncounted" in said
    assert "inside If/Loop/Scan subgraphs" in said
    roof = json.loads(report.read_text())["cells"][0]["roofline"]
    assert roof["flops_partial"] is True and roof["uncounted_nodes"] == 1 and roof["subgraph_nodes"] > 100
    markdown = (tmp_path / "vad.md").read_text()
    assert "| ≥" in markdown and "FLOP/s marked ≥ are lower bounds" in markdown


def test_a_fully_counted_model_is_not_marked(tmp_path):
    model = make_mlp(tmp_path / "mlp.onnx")
    result = runner.invoke(app, ["bench", str(model), *FAST, "--json"])
    assert result.exit_code == 0, result.output
    roof = json.loads(result.stdout)["cells"][0]["roofline"]
    assert roof["flops_partial"] is False and roof["uncounted_nodes"] == 0
    text = runner.invoke(app, ["bench", str(model), *FAST])
    assert "≥" not in text.output and "lower bound" not in text.output


def test_inspect_says_the_flop_count_is_partial(silero_vad_model):
    result = runner.invoke(app, ["inspect", str(silero_vad_model), "-n", "0", "--shape", "input=1x512",
                                 "--shape", "state=2x1x128"])
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "≥ 1 FLOPs" in said and "partial FLOP count, 1 node(s) uncounted: If x1" in said
    assert "node(s) inside If/Loop/Scan subgraphs" in said
