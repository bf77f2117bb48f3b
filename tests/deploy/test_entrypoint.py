"""The containers' entrypoint script, run here on the CPU as the container would run it: it serves only when
`onnxaccel doctor --target` passes, and the server it starts answers the health checks the images and the
Kubernetes manifests use. (No container, no GPU: the script runs directly with this venv's `onnxaccel`.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from model_builders import ROOT

SCRIPT = ROOT / "docker" / "entrypoint.sh"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def env(tmp_path: Path, **extra) -> dict:
    bin_dir = str(Path(sys.executable).parent)
    out = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "ONNXACCEL_CACHE_DIR": str(tmp_path / "cache"), "ONNXACCEL_HOST": "127.0.0.1"}
    out.update(extra)
    return out


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_gate_passes_and_the_server_answers_health_and_metrics(tmp_path, mlp_path):
    http = free_port()
    proc = subprocess.Popen(["sh", str(SCRIPT), "--no-grpc", "--max-batch", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env=env(tmp_path, ONNXACCEL_MODEL=str(mlp_path), ONNXACCEL_TARGET="cpu",
                                    ONNXACCEL_HTTP_PORT=str(http)))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"the entrypoint exited {proc.returncode}:\n{proc.stdout.read()}")
            try:
                if get(f"http://127.0.0.1:{http}/v2/health/ready") == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("the server did not become ready in 120 s")
        assert get(f"http://127.0.0.1:{http}/v2/health/live") == 200
        assert get(f"http://127.0.0.1:{http}/metrics") == 200
        # the exact probe command of the images' HEALTHCHECK
        check = subprocess.run([sys.executable, "-c", "import os, urllib.request; urllib.request.urlopen("
                                "'http://127.0.0.1:%s/v2/health/ready' % os.environ.get('ONNXACCEL_HTTP_PORT', "
                                "'8000'), timeout=4)"], env=env(tmp_path, ONNXACCEL_HTTP_PORT=str(http)), timeout=30)
        assert check.returncode == 0
    finally:
        proc.terminate()
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
    assert "cpu" in output.lower()  # the doctor report went to the log before the server started


def test_gate_refuses_a_target_that_is_not_ready(tmp_path, mlp_path):
    http = free_port()
    proc = subprocess.run(["sh", str(SCRIPT)], capture_output=True, text=True, timeout=300,
                          env=env(tmp_path, ONNXACCEL_MODEL=str(mlp_path), ONNXACCEL_TARGET="rocm",
                                  ONNXACCEL_HTTP_PORT=str(http)))
    assert proc.returncode == 1
    assert "target 'rocm' is not ready in this container" in proc.stderr
    with pytest.raises(OSError):  # nothing was started
        get(f"http://127.0.0.1:{http}/v2/health/live")


def test_the_healthcheck_probe_fails_when_nothing_listens(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os, urllib.request; urllib.request.urlopen("
                           "'http://127.0.0.1:%s/v2/health/ready' % os.environ.get('ONNXACCEL_HTTP_PORT', '8000'), "
                           "timeout=4)"], env=env(tmp_path, ONNXACCEL_HTTP_PORT=str(free_port())),
                          capture_output=True, timeout=30)
    assert proc.returncode != 0


def test_doctor_json_for_cpu_is_ready(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", "doctor", "--target", "cpu", "--json"],
                          capture_output=True, text=True, env=env(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["targets"][0]["ready"] is True
