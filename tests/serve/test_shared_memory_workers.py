"""System shared memory with several worker processes (``--workers 2``, with and without ``--shared-models``): a
region registered through one connection is used by requests on many new connections, whichever worker takes
them (each worker maps the object: /proc/PID/maps shows it in both); an unregister through one connection takes
effect in every worker (every new connection is refused, and every worker unmaps the object); a region
registered again under the same name with another object is read from the new one everywhere; the registry's
private folder is gone after the server stops.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.serve.conftest import ServerProcess
from tests.serve.shm_client import children, mapping, shm_object, triton_shm

tritonhttp = pytest.importorskip("tritonclient.http")
tritongrpc = pytest.importorskip("tritonclient.grpc")

ROWS = 32


def request_body(row: int) -> dict:
    """Row ``row`` of region "in" (a [1, 4] FP32 tensor) into slot ``row`` of region "out" ([1, 3] FP32), as
    tritonclient sends it (InferInput/InferRequestedOutput.set_shared_memory)."""
    return {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {
                "shared_memory_region": "in", "shared_memory_byte_size": 16, "shared_memory_offset": 16 * row}}],
            "outputs": [{"name": "probs", "parameters": {
                "shared_memory_region": "out", "shared_memory_byte_size": 12, "shared_memory_offset": 12 * row}}]}


def infer_on_new_connections(url: str, rows: range) -> list[httpx.Response]:
    """One request per row, concurrently, each on a connection of its own (the kernel gives each to any worker)."""

    async def one(row: int) -> httpx.Response:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await client.post("/v2/models/mlp/infer", json=request_body(row))

    async def run():
        return await asyncio.gather(*(one(row) for row in rows))

    return asyncio.run(run())


def infer_grpc_on_new_channels(address: str, rows: range) -> None:
    for row in rows:
        client = tritongrpc.InferenceServerClient(address)  # a new channel: a new connection
        tensor = tritongrpc.InferInput("x", [1, 4], "FP32")
        tensor.set_shared_memory("in", 16, offset=16 * row)
        output = tritongrpc.InferRequestedOutput("probs")
        output.set_shared_memory("out", 12, offset=12 * row)
        client.infer("mlp", [tensor], outputs=[output])
        client.close()


def until_both_workers_mapped(url: str, workers: list[int], key: str, timeout: float = 60.0) -> bool:
    """Rows 0..ROWS-1 on new connections, in bursts and then one at a time, until two processes map ``key``.

    Which worker accepts a connection is the kernel's choice: both workers wait on the one listening socket, and
    the one woken first accepts every connection already queued (asyncio accepts in a loop), so a burst can go
    to one worker whole, round after round on a loaded machine. One connection at a
    time wakes both workers afresh for each."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for response in infer_on_new_connections(url, range(ROWS)):
            assert response.status_code == 200, response.text
            assert "data" not in response.json()["outputs"][0]
        for row in range(ROWS):
            if len(mapping(workers, key)) >= 2:
                return True
            infer_on_new_connections(url, range(row, row + 1))[0].raise_for_status()
    return len(mapping(workers, key)) >= 2


def wait_for(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.parametrize("layout", [["--workers", "2"], ["--workers", "2", "--shared-models"]],
                         ids=["workers", "shared-models"])
def test_a_region_registered_through_one_worker_serves_every_worker(tmp_path, mlp_path, layout):
    shm = triton_shm()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    server = ServerProcess(mlp_path, *layout, "--shared-memory", "system", "--max-batch", "8", log=tmp_path / "serve.log",
                           env={"TMPDIR": str(tmp)}).wait_ready(120)
    session = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    x, other = rng.random((ROWS, 4), dtype=np.float32), rng.random((ROWS, 4), dtype=np.float32)
    try:
        with shm_object(16 * ROWS) as (in_key, in_handle), shm_object(16 * ROWS) as (other_key, other_handle), \
                shm_object(12 * ROWS) as (out_key, out_handle):
            shm.set_shared_memory_region(in_handle, [x])
            shm.set_shared_memory_region(other_handle, [other])
            registrar = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
            registrar.register_system_shared_memory("in", in_key, 16 * ROWS)
            registrar.register_system_shared_memory("out", out_key, 12 * ROWS)
            registrar.close()
            assert sorted(p["name"] for p in httpx.get(f"{server.url}/v2/systemsharedmemory/status").json()) == \
                ["in", "out"]
            workers = [p for p in children(server.proc.pid)]
            assert until_both_workers_mapped(server.url, workers, in_key), "only one worker ever mapped the region"
            assert len(mapping(workers, out_key)) >= 2
            infer_grpc_on_new_channels(server.grpc_url, range(0, ROWS, 4))
            np.testing.assert_allclose(shm.get_contents_as_numpy(out_handle, np.float32, [ROWS, 3]),
                                       session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)

            # Unregistered through one connection: refused on every new one, unmapped by every worker.
            assert httpx.post(f"{server.url}/v2/systemsharedmemory/region/in/unregister").status_code == 200
            for response in infer_on_new_connections(server.url, range(ROWS)):
                assert response.status_code == 400
                assert "region 'in', which is not registered" in response.json()["error"]
            with pytest.raises(tritongrpc.InferenceServerException, match="not registered"):
                infer_grpc_on_new_channels(server.grpc_url, range(1))
            assert wait_for(lambda: not mapping(workers, in_key)), mapping(workers, in_key)
            assert mapping(workers, out_key)  # still registered, still mapped

            # The same name for another object: every worker reads the new one.
            httpx.post(f"{server.url}/v2/systemsharedmemory/region/in/register",
                       json={"key": other_key, "byte_size": 16 * ROWS}).raise_for_status()
            assert until_both_workers_mapped(server.url, workers, other_key)
            np.testing.assert_allclose(shm.get_contents_as_numpy(out_handle, np.float32, [ROWS, 3]),
                                       session.run(None, {"x": other})[0], rtol=1e-5, atol=1e-6)
            httpx.post(f"{server.url}/v2/systemsharedmemory/unregister").raise_for_status()
            assert httpx.get(f"{server.url}/v2/systemsharedmemory/status").json() == []
            assert wait_for(lambda: not mapping(workers, out_key) and not mapping(workers, other_key))
    finally:
        assert server.stop(60) == 0, server.log()
    assert not list(tmp.glob("onnxaccel-shm-*")), "the registry folder outlived the server"
