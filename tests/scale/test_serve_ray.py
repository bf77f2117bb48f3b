"""`serve --ray`: the onnxaccel server as a Ray Serve deployment answers Open Inference Protocol requests from real
clients (httpx JSON, tritonclient binary) on loopback, with the values ONNX Runtime computes, then stops.

It runs ``scale.serve_ray.run`` exactly as `onnxaccel serve --ray` calls it (blocking, ``on_ready`` with the
server, stopped by SIGTERM in the CLI and by the ``stop`` event here)."""

from __future__ import annotations

import queue
import threading

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from onnxaccel.serve.config import ServerConfig


def test_serve_on_ray_answers_v2_infer_and_stops(ray_cluster, mlp_path):
    from onnxaccel.scale import serve_ray

    defaults = {"target": "cpu", "max_batch": 8, "max_queue_delay_ms": 2.0}
    config = ServerConfig(host="127.0.0.1", http_port=0, grpc_port=None)
    ready, stop, outcome = queue.Queue(), threading.Event(), {}

    def serve() -> None:
        try:
            outcome["result"] = serve_ray.run(str(mlp_path), defaults, config, ready.put, stop=stop, address="auto",
                                              replicas=1, ready_timeout_s=120)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            outcome["error"] = exc
            ready.put(None)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    server = ready.get(timeout=180)
    assert server is not None, outcome.get("error")
    try:
        _check_protocol(server.url, mlp_path)
        assert server.result().models == [{"name": "mlp", "version": "1", "state": "READY"}]
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and "error" not in outcome
    assert outcome["result"].http_url == server.url
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.url}/v2/health/live", timeout=2)


def _check_protocol(url: str, mlp_path) -> None:
    assert url.startswith("http://127.0.0.1:")
    rows = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    expected = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"]).run(None, {"x": rows})[0]

    assert httpx.get(f"{url}/v2/health/ready").json() == {"ready": True}
    meta = httpx.get(f"{url}/v2/models/mlp").json()
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    body = {"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32", "data": rows.ravel().tolist()}]}
    answer = httpx.post(f"{url}/v2/models/mlp/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    out = answer.json()["outputs"][0]
    assert out["name"] == "probs" and out["shape"] == [3, 3]
    np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(3, 3), expected, rtol=1e-6)

    import tritonclient.http as triton  # the binary tensor extension, as Triton's own client sends it

    client = triton.InferenceServerClient(url.removeprefix("http://"))
    tensor = triton.InferInput("x", [3, 4], "FP32")
    tensor.set_data_from_numpy(rows, binary_data=True)
    result = client.infer("mlp", [tensor], outputs=[triton.InferRequestedOutput("probs", binary_data=True)])
    np.testing.assert_allclose(result.as_numpy("probs"), expected, rtol=1e-6)

    bad = httpx.post(f"{url}/v2/models/nope/infer", json=body)
    assert bad.status_code == 404 and "Unknown model 'nope'" in bad.json()["error"]  # the same errors as `serve`


@pytest.mark.slow
def test_serve_cli_with_ray_flag_serves_and_exits_0_on_sigterm(tmp_path, mlp_path):
    """`onnxaccel serve MODEL --ray local`: its own loopback cluster, a v2 answer, SIGTERM -> exit 0, clean --json
    stdout, the cluster gone. Skipped until cli/serve.py has the --ray option calling scale.serve_ray.run."""
    import json
    import os
    import signal
    import subprocess
    import sys

    import typer

    from onnxaccel.cli import serve as serve_cli

    app = typer.Typer()
    serve_cli.register(app)
    command = typer.main.get_command(app)
    if "ray" not in {p.name for p in command.params}:
        pytest.skip("cli/serve.py has no --ray option yet")
    from tests.serve.conftest import SERVE, free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "serve", str(mlp_path), "--target", "cpu", "--ray", "local",
                             "--replicas", "1", "--http-port", str(port), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["event"] == "ready" and ready["models"][0]["state"] == "READY"
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}]}
        assert httpx.post(f"http://127.0.0.1:{port}/v2/models/mlp/infer", json=body, timeout=30).status_code == 200
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert json.loads(out)["event"] == "stopped"
