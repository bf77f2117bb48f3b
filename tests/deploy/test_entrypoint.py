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


def test_compile_then_serve_from_the_artifacts_directory(tmp_path, mlp_path):
    """The init container's step (`compile` as the first argument), then the server started with
    ONNXACCEL_ARTIFACTS: ready, answering, and the directory untouched by it."""
    art = tmp_path / "artifacts"
    settings = dict(ONNXACCEL_MODEL=str(mlp_path), ONNXACCEL_TARGET="cpu", ONNXACCEL_ARTIFACTS=str(art))
    compiled = subprocess.run(["sh", str(SCRIPT), "compile", "--max-batch", "1", "--json"], capture_output=True,
                              text=True, timeout=300, env=env(tmp_path, **settings))
    assert compiled.returncode == 0, compiled.stderr
    assert json.loads(compiled.stdout[compiled.stdout.index("{"):])["schema"] == "onnxaccel.compile/1"
    before = {p: p.stat().st_mtime_ns for p in art.rglob("*")}
    http = free_port()
    proc = subprocess.Popen(["sh", str(SCRIPT), "--no-grpc", "--max-batch", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env(tmp_path, ONNXACCEL_HTTP_PORT=str(http),
                                                                         **settings))
    try:
        deadline = time.monotonic() + 120
        while get_or_none(f"http://127.0.0.1:{http}/v2/health/ready") != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"not ready (exit {proc.poll()})")
            time.sleep(0.5)
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
        request = urllib.request.Request(f"http://127.0.0.1:{http}/v2/models/mlp/infer", body.encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            (output,) = json.loads(response.read())["outputs"]
        assert output["name"] == "probs" and abs(sum(output["data"]) - 1) < 1e-5
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert {p: p.stat().st_mtime_ns for p in art.rglob("*")} == before

    # The same directory claiming another ONNX Runtime: the model is refused with the field named, not compiled.
    manifest = json.loads((art / "manifest.json").read_text())
    for artifact in manifest["artifacts"]:
        artifact["key"]["runtime"]["onnxruntime"] = "1.0.0"
    (art / "manifest.json").write_text(json.dumps(manifest))
    refused = subprocess.run(["sh", str(SCRIPT), "--no-grpc", "--max-batch", "1"], capture_output=True, text=True,
                             timeout=300, env=env(tmp_path, ONNXACCEL_HTTP_PORT=str(free_port()), **settings))
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0 and "onnxruntime" in said and "here, 1.0.0 in the manifest" in said, said


def get_or_none(url: str) -> int | None:
    try:
        return get(url)
    except OSError:
        return None
