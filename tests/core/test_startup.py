"""startup.py: stages timed where they happen, merged across processes, reported per stage and as a wall time."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from onnxaccel import startup


@pytest.fixture(autouse=True)
def clean():
    startup.reset()
    yield
    startup.reset()


def test_stages_are_summed_in_order_with_counts_and_details():
    with startup.stage("session", detail="cpu/fp32 b1"):
        time.sleep(0.01)
    with startup.stage("session", detail="cpu/fp32 b8"):
        pass
    startup.record("model read", 0.5, detail="m.onnx")
    report = startup.summary(first_result=True)
    rows = report.stages()
    assert [r[0] for r in rows] == ["model read", "session"]  # STAGES order, not recording order
    assert rows[1][2] == 2 and rows[1][3] == "cpu/fp32 b1, cpu/fp32 b8" and rows[1][1] >= 0.01
    data = report.to_dict()
    assert data["schema"] == "onnxaccel.startup/1" and data["to_first_result_s"] > 0
    back = startup.Startup.from_dict(json.loads(json.dumps(data))).stages()
    assert [(n, c, d) for n, _, c, d in back] == [(n, c, d) for n, _, c, d in rows]
    assert [s for _, s, _, _ in back] == pytest.approx([s for _, s, _, _ in rows], abs=1e-5)
    assert "session 0.01 s (x2)" in report.line()


def test_a_failed_stage_is_still_recorded():
    with pytest.raises(RuntimeError), startup.stage("session"):
        raise RuntimeError("no")
    assert startup.spans()[0].detail == "failed"


def test_first_result_may_be_the_end_of_the_first_span_of_a_stage():
    startup.record("first run", 0.25, start=1.0)
    startup.record("first run", 0.25, start=3.0)
    assert startup.summary(first_result="first run").to_first_result_s == pytest.approx(1.25)
    assert startup.summary(first_result="graph capture").to_first_result_s is None


def test_spans_of_another_process_land_on_this_ones_scale_with_its_label():
    startup.merge([{"stage": "session", "seconds": 2.0, "start": 1.0}], offset=0.5, process="model process")
    span = startup.spans()[0]
    assert (span.start, span.process) == (1.5, "model process")
    assert startup.summary().stages()[0][0] == "session (model process)"


def test_the_process_start_is_before_the_import_of_the_module():
    code = ("import time; t=time.time(); from onnxaccel import startup; "
            "print(startup.PROCESS_START <= t, startup.now() > 0, startup.record_import().start == 0.0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "True"]


def test_run_json_and_text_report_the_start_up(mlp_path):
    from typer.testing import CliRunner

    from onnxaccel.cli.main import app

    done = CliRunner().invoke(app, ["run", str(mlp_path), "--target", "cpu", "--json"])
    assert done.exit_code == 0, done.output
    started = json.loads(done.stdout)["startup"]
    stages = {r["stage"] for r in started["stages"]}
    assert {"import", "model read", "session", "first run"} <= stages and started["to_first_result_s"] > 0
    done = CliRunner().invoke(app, ["run", str(mlp_path), "--target", "cpu"])
    assert "start-up" in done.stdout and "to the first result" in done.stdout
