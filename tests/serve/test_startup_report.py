"""Start-up is reported where a server says it is ready: the stages of every process (the model process's
too, with --shared-models) in the JSON ready event, the text ready message, and /metrics."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.serve.conftest import SERVE


def _ready_event(source, *args: str, timeout: float = 120):
    """`serve SOURCE ARGS --json`: its ready event and the /metrics text; SIGTERM after."""
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "serve", str(source), "--target", "cpu", "--http-port",
                             "0", "--no-grpc", *args, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "COLUMNS": "200"})
    try:
        deadline, line = time.monotonic() + timeout, ""
        while not line and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                line = proc.stdout.readline()
        assert line, f"no ready event: {proc.stderr.read() if proc.poll() is not None else 'timed out'}"
        event = json.loads(line)
        metrics = httpx.get(f"{event['http_url']}/metrics", timeout=10).text
        return event, metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _stages(event) -> dict[str, float]:
    return {row["stage"]: row["seconds"] for row in event["startup"]["stages"]}


def test_one_process_server_reports_its_start_up_at_ready_and_in_metrics(mlp_path):
    event, metrics = _ready_event(mlp_path, "--workers", "1", "--instances", "2")
    started = event["startup"]
    assert started["schema"] == "onnxaccel.startup/1" and started["to_ready_s"] > 0
    stages = _stages(event)
    assert {"model read", "session"} <= set(stages), stages
    session = next(r for r in started["stages"] if r["stage"] == "session")
    assert session["count"] == 2  # one session per instance
    assert all(0 <= s <= started["to_ready_s"] for s in stages.values())
    assert 'onnxaccel_startup_seconds{process="server",stage="session"}' in metrics
    assert "onnxaccel_time_to_ready_seconds" in metrics


def test_shared_models_server_reports_the_model_process_and_a_worker(mlp_path):
    event, metrics = _ready_event(mlp_path, "--workers", "2", "--shared-models")
    stages = _stages(event)
    assert "session (model process)" in stages and "model read (model process)" in stages, stages
    assert "workers" in stages
    spans = event["startup"]["spans"]
    model_side = [s for s in spans if s["process"] == "model process"]
    # placed on the supervisor's time scale: after the supervisor started, before it was ready
    assert model_side and all(0 < s["start"] < event["startup"]["to_ready_s"] for s in model_side)
    assert 'process="model process"' in metrics
    # The workers start while the model process loads (they used to be spawned only once it was ready).
    worker_import = next(s for s in spans if s["process"].startswith("worker ") and s["stage"] == "import")
    model_ready = max(s["start"] + s["seconds"] for s in model_side)
    assert worker_import["start"] < model_ready, (worker_import, model_ready)
