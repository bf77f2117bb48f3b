"""`onnxaccel serve` at start-up, as a real process on loopback: a server whose every model failed to load
stops with the reasons (unless --allow-unavailable), and a port in use (HTTP or gRPC) is one clean error line
with exit 2, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.serve.conftest import SERVE, ServerProcess, free_port


def serve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SERVE, "serve", *args, "--target", "cpu"], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "COLUMNS": "400"})


@pytest.fixture
def broken_model(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"this is not an onnx model")
    return path


def test_every_model_failed_exits_nonzero_with_reasons(broken_model):
    done = serve(str(broken_model), "--http-port", str(free_port()), "--grpc-port", str(free_port()))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "No model could be loaded" in done.stderr and "broken:" in done.stderr
    assert "--allow-unavailable" in done.stderr and "Traceback" not in done.stderr


def test_allow_unavailable_keeps_serving_503(broken_model, tmp_path):
    proc = ServerProcess(broken_model, "--allow-unavailable", log=tmp_path / "server.log")
    try:
        deadline = time.monotonic() + 60
        # "serving" is printed once the models were loaded (or failed to); the models' states may come after it
        # in the log (a full suite once read the log between the two), so wait for both.
        while "serving" not in proc.log() or "UNAVAILABLE" not in proc.log():
            assert proc.proc.poll() is None and time.monotonic() < deadline, proc.log()
            time.sleep(0.1)
        body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [0.0]}]}
        response = httpx.post(f"{proc.url}/v2/models/broken/infer", json=body, timeout=5)
        assert response.status_code == 503 and "UNAVAILABLE" in response.text, response.text
    finally:
        assert proc.stop() == 0, proc.log()


@pytest.mark.parametrize("which", ["http", "grpc"])
def test_port_in_use_is_one_clean_line(which):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        ports = (taken, free_port()) if which == "http" else (free_port(), taken)
        done = serve("zoo:bert-tiny", "--http-port", str(ports[0]), "--grpc-port", str(ports[1]))
    option = f"--{which}-port"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{taken}" in lines[0] and "in use" in lines[0] and option in lines[0]
    assert "Traceback" not in done.stderr and "bug" not in done.stderr
