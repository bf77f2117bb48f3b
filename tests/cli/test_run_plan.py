"""`run` says what ran: its --json carries the ExecutionPlan and its text shows the plan's target and precision."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from onnxaccel.cli.main import app


def test_run_prints_its_plan(mlp_path):
    done = CliRunner().invoke(app, ["run", str(mlp_path), "-t", "cpu", "--json"])
    assert done.exit_code == 0, done.output
    plan = json.loads(done.stdout)["plan"]
    assert plan["schema"] == "onnxaccel.plan/1" and plan["command"] == "run" and plan["target"] == "cpu"
    assert [c["name"] for c in plan["choices"]][:2] == ["target", "precision"]
    text = CliRunner().invoke(app, ["run", str(mlp_path), "-t", "cpu"])
    assert "plan: target: cpu (as given)" in text.output
