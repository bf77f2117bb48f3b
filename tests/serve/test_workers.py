"""`serve --workers N`: several real server processes behind one HTTP port and one gRPC port.

What must hold: every request gets its own correct answer whichever worker takes it; the kernel really spreads
connections over the workers (each worker's own metrics file shows requests); /metrics and Triton's statistics
add up all workers; readiness waits for every worker; a killed worker is replaced; repository load/unload is
refused with the reason; SIGTERM drains every worker and the supervisor exits 0; a model that cannot load
keeps serving with the model unavailable (as with one process), and a worker that cannot start at all ends
the start with its error, not a hang.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.serve.conftest import SERVE, ServerProcess

tritongrpc = pytest.importorskip("tritonclient.grpc")


def children(pid: int) -> list[int]:
    """The supervisor's worker processes (spawned; its multiprocessing resource tracker left out)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
            except OSError:
                pass
    return found


def metrics_dir(tmp: Path) -> Path:
    dirs = list(tmp.glob("onnxaccel-metrics-*"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def infer_many(url: str, x: np.ndarray, count: int) -> list[np.ndarray]:
    """``count`` concurrent requests, each on its own connection (so the kernel can hand each to any worker)."""

    async def one(i):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": x[i].tolist()}]}
            response = await client.post("/v2/models/mlp/infer", json=body)
            assert response.status_code == 200, response.text
            out = response.json()["outputs"][0]
            return np.array(out["data"], dtype=np.float32).reshape(out["shape"])

    async def run():
        return await asyncio.gather(*(one(i) for i in range(count)))

    return asyncio.run(run())


@pytest.fixture
def workers_server(tmp_path, mlp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    server = ServerProcess(mlp_path, "--workers", "2", "--max-batch", "8", "--model-control", "explicit",
                           log=tmp_path / "serve.log",
                           env={"TMPDIR": str(tmp)})
    server.tmp = tmp
    yield server.wait_ready(120)
    server.stop()


def test_two_workers_answer_correctly_and_both_take_requests(workers_server, mlp_path):
    server = workers_server
    assert len(children(server.proc.pid)) == 2
    sess = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    folder = metrics_dir(server.tmp)
    sent = 0
    for _ in range(10):  # until the kernel has given connections to both workers (normally the first round)
        x = rng.random((32, 4), dtype=np.float32)
        outputs = infer_many(server.url, x, 32)
        sent += 32
        for i, y in enumerate(outputs):
            np.testing.assert_allclose(y, sess.run(None, {"x": x[i:i + 1]})[0], rtol=1e-5, atol=1e-6)
        if len(list(folder.glob("counter_*.db"))) >= 2:
            break
    assert len(list(folder.glob("counter_*.db"))) >= 2, "only one worker ever answered"

    # /metrics and Triton's statistics add up both workers, whichever answers the scrape.
    for _ in range(4):
        text = httpx.get(f"{server.url}/metrics").text
        line = next(li for li in text.splitlines() if li.startswith('onnxaccel_requests_total{code="200"'))
        assert float(line.split()[-1]) == sent
        assert 'onnxaccel_model_ready{model="mlp"} 1.0' in text
        stats = httpx.get(f"{server.url}/v2/models/mlp/stats").json()["model_stats"][0]
        assert stats["inference_count"] == sent
        assert stats["inference_stats"]["success"]["count"] == sent
        assert 1 <= stats["execution_count"] <= sent

    # gRPC reaches the workers on the shared port too.
    client = tritongrpc.InferenceServerClient(server.grpc_url)
    value = tritongrpc.InferInput("x", [1, 4], "FP32")
    value.set_data_from_numpy(x[:1])
    result = client.infer("mlp", [value]).as_numpy("probs")
    np.testing.assert_allclose(result, sess.run(None, {"x": x[:1]})[0], rtol=1e-5, atol=1e-6)
    client.close()

    # The repository API would change one worker's copy only: refused with the reason.
    response = httpx.post(f"{server.url}/v2/repository/models/mlp/unload")
    assert response.status_code == 400 and "--workers 2" in response.json()["error"]


def test_a_killed_worker_is_replaced_and_sigterm_drains_all(workers_server, mlp_path):
    server = workers_server
    before = children(server.proc.pid)
    victim = before[-1]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        now = [p for p in children(server.proc.pid) if p != victim]
        if len(now) >= len(before) and set(now) != set(before):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"no replacement worker: {children(server.proc.pid)}\n{server.log()}")
    # The replacement loads its model before taking connections; every request keeps succeeding meanwhile.
    x = np.random.default_rng(0).random((24, 4), dtype=np.float32)
    assert len(infer_many(server.url, x, 24)) == 24
    assert "exited with status -9" in server.log()
    folder = metrics_dir(server.tmp)
    workers = children(server.proc.pid)
    assert server.stop(60) == 0
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert not folder.exists()


def test_a_worker_that_cannot_start_ends_the_start_with_its_error(tmp_path):
    empty = tmp_path / "repo"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-c", SERVE, "serve", str(empty), "--target", "cpu", "--workers", "2",
                           "--http-port", "0", "--grpc-port", "0"], capture_output=True, text=True, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Traceback" not in text
    assert "Server worker" in text and "No models found" in text and "hint:" in text


def test_workers_stop_when_the_supervisor_is_killed(workers_server):
    server = workers_server
    workers = children(server.proc.pid)
    assert len(workers) == 2
    server.proc.kill()
    server.proc.wait()
    deadline = time.monotonic() + 60
    alive = workers
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path(f"/proc/{p}").exists()
                 and "zombie" not in Path(f"/proc/{p}/status").read_text()]
        time.sleep(0.2)
    assert not alive, f"workers outlived their supervisor: {alive}"


def test_a_grpc_port_another_server_shares_out_is_refused(tmp_path, mlp_path):
    import socket

    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as gRPC servers bind by default
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        proc = subprocess.run([sys.executable, "-c", SERVE, "serve", str(mlp_path), "--target", "cpu", "--workers",
                               "2", "--http-port", "0", "--grpc-port", str(taken.getsockname()[1])],
                              capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Cannot listen for gRPC" in text and "Traceback" not in text


def test_the_server_process_shortens_the_gil_switch_interval():
    """The run threads wait for the GIL around every model run; the server sets a short switch interval."""
    from onnxaccel.serve.config import ServerConfig
    from onnxaccel.serve.server import run_server

    class Probe:
        def __init__(self, ms):
            self.config = ServerConfig(gil_switch_ms=ms)

        async def run(self):
            return sys.getswitchinterval()

    before = sys.getswitchinterval()
    try:
        assert run_server(Probe(0.5)) == pytest.approx(0.0005)
        sys.setswitchinterval(before)
        assert run_server(Probe(0)) == pytest.approx(before)  # 0 leaves Python's own
    finally:
        sys.setswitchinterval(before)
