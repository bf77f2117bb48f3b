"""Back-pressure and shutdown on real servers: overload answers 429/503 with a message and memory stays
bounded; a request past its deadline gets 503; SIGTERM lets in-flight requests finish, refuses new ones, and
the process exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import make_mlp
from tests.serve.conftest import ServerProcess


def cls_body(rows: int = 1, seed: int = 0) -> tuple[bytes, dict]:
    x = np.random.default_rng(seed).random((rows, 3, 48, 192), dtype=np.float32)
    head = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


@pytest.fixture(scope="module")
def overload_server(tmp_path_factory, pretrained_cls):
    root = tmp_path_factory.mktemp("overload")
    (root / "cls.onnx").write_bytes(Path(pretrained_cls).read_bytes())
    proc = ServerProcess(root, "--max-batch", "1", "--max-queue", "2", "--max-connections", "24",
                         log=root / "server.log")
    yield proc.wait_ready()
    assert proc.stop() == 0, proc.log()


def test_overload_is_refused_with_429_or_503_and_memory_stays_bounded(overload_server):
    server = overload_server
    body, headers = cls_body()
    url = f"{server.url}/v2/models/cls/infer"
    assert httpx.post(url, content=body, headers=headers).status_code == 200
    rss_before = server.rss_bytes()

    async def storm():
        limits = httpx.Limits(max_connections=48, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            async def one():
                try:
                    return await client.post(url, content=body, headers=headers)
                except httpx.TransportError as exc:  # uvicorn may reset connections over --max-connections
                    return exc
            responses = []
            for _ in range(12):  # three storms at least; more while none was refused (a slow, busy client)
                responses += await asyncio.gather(*(one() for _ in range(48)))
                if len(responses) >= 3 * 48 and any(getattr(r, "status_code", 0) == 429 for r in responses):
                    break
            return responses

    responses = asyncio.run(storm())
    answered = [r for r in responses if isinstance(r, httpx.Response)]
    codes = {r.status_code for r in answered}
    assert codes <= {200, 429, 503}, codes
    assert 200 in codes and 429 in codes  # the queue refused; 503 comes from --max-connections
    refused = [r for r in answered if r.status_code == 429]
    for r in refused:
        assert "max_queue 2" in r.json()["error"] and r.headers["Retry-After"] == "1"
    assert server.proc.poll() is None
    assert httpx.post(url, content=body, headers=headers).status_code == 200
    growth = server.rss_bytes() - rss_before
    assert growth < 150 * 1024 * 1024, f"RSS grew by {growth / 2**20:.0f} MiB under overload"


def test_request_past_its_deadline_gets_503(overload_server):
    x = np.zeros((1, 3, 48, 192), np.float32)
    doc = {"parameters": {"timeout": 1},  # microseconds, as tritonclient's client_timeout parameter
           "inputs": [{"name": "x", "shape": [1, 3, 48, 192], "datatype": "FP32", "data": x.reshape(-1).tolist()}]}
    response = httpx.post(f"{overload_server.url}/v2/models/cls/infer", json=doc, timeout=30)
    assert response.status_code == 503 and "timed out after" in response.json()["error"]


def inflight(server) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith("onnxaccel_inflight_requests "):
            return float(line.split()[1])
    return 0.0


def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0(tmp_path):
    make_mlp(tmp_path / "mlp.onnx")
    # Batches wait 3 s for company (a fixed delay): requests stay in flight long enough to SIGTERM in between.
    server = ServerProcess(tmp_path / "mlp.onnx", "--max-batch", "64", "--max-queue-delay-ms", "3000",
                           "--queue-delay", "fixed",
                           log=tmp_path / "server.log").wait_ready()
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.5, 0.1, 0.2, 0.3]}]}
    results: list = []

    def send():
        try:
            results.append(httpx.post(f"{server.url}/v2/models/mlp/infer", json=body, timeout=30).status_code)
        except httpx.HTTPError as exc:
            results.append(exc)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while inflight(server) < 8:  # all eight are inside the server, waiting for their batch
        assert time.monotonic() < deadline, f"only {inflight(server)} requests arrived"
        time.sleep(0.05)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:
        late = httpx.post(f"{server.url}/v2/models/mlp/infer", json=body, timeout=10)
        assert late.status_code == 503 and "shutting down" in late.json()["error"]
        assert httpx.get(f"{server.url}/v2/health/ready").status_code == 400
    except httpx.ConnectError:
        pass  # the listener had already closed: refused as well
    for t in threads:
        t.join(30)
    assert results == [200] * 8, results
    assert server.proc.wait(20) == 0, server.log()
    assert time.monotonic() - start < 10
    server.stop()
