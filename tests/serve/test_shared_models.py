"""`serve --workers N --shared-models`: decoding workers, one model process that batches all their requests.

What must hold: the supervisor runs one model process and N workers; each request gets its own correct answer;
requests that reached different workers are joined into one batch; tensors above the inline size travel
through the workers' shared-memory arenas and come back intact; load/unload through the protocol works (one
copy to change) and every worker sees the new state; a killed model process fails the waiting requests with
503, is replaced, and the workers reconnect by themselves; SIGTERM drains and the supervisor exits 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxaccel.serve.arena import Arena
from onnxaccel.serve.model_link import INLINE_BYTES
from tests.serve.conftest import ServerProcess
from tests.serve.test_workers import children, metrics_dir

tritonhttp = pytest.importorskip("tritonclient.http")


def make_mean(path: Path) -> Path:
    """image[N,3,224,224] -> ReduceMean over H,W -> [N,3]: a model whose requests carry 600 kB per row."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["image"], ["mean"], axes=[2, 3], keepdims=0)], "mean",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["N", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture
def shared_server(tmp_path, mlp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mlp.onnx").write_bytes(mlp_path.read_bytes())
    make_mean(repo / "mean.onnx")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # A long fixed queue delay: the batch of 16 below runs when it is full, whichever workers its requests reached,
    # and a lone request waits in the model process's queue (the adaptive delay would run it at once).
    server = ServerProcess(repo, "--workers", "2", "--shared-models", "--model-control", "explicit", "--max-batch", "16",
                           "--max-queue-delay-ms", "1500", "--queue-delay", "fixed", log=tmp_path / "serve.log",
                           env={"TMPDIR": str(tmp)})
    server.tmp = tmp
    server.repo = repo
    yield server.wait_ready(120)
    server.stop()


def post_many(url: str, model: str, bodies: list[dict]) -> list[httpx.Response]:
    """Concurrent requests, each on its own connection (so the kernel hands them to either worker)."""

    async def one(body):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await client.post(f"/v2/models/{model}/infer", json=body)

    async def run():
        return await asyncio.gather(*(one(b) for b in bodies))

    return asyncio.run(run())


def mlp_body(row: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": row.tolist()}]}


def stats(url: str, model: str) -> dict:
    return httpx.get(f"{url}/v2/models/{model}/stats").json()["model_stats"][0]


def test_one_model_process_batches_the_requests_of_every_worker(shared_server, mlp_path):
    server = shared_server
    assert len(children(server.proc.pid)) == 3  # the model process and two workers
    sess = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    folder = metrics_dir(server.tmp)
    sent = 0
    for _ in range(10):  # until the kernel has handed connections to both workers (normally the first round)
        x = rng.random((16, 4), dtype=np.float32)
        before = stats(server.url, "mlp")
        responses = post_many(server.url, "mlp", [mlp_body(x[i:i + 1]) for i in range(16)])
        sent += 16
        for i, response in enumerate(responses):
            assert response.status_code == 200, response.text
            out = response.json()["outputs"][0]
            got = np.array(out["data"], dtype=np.float32).reshape(out["shape"])
            np.testing.assert_allclose(got, sess.run(None, {"x": x[i:i + 1]})[0], rtol=1e-5, atol=1e-6)
        after = stats(server.url, "mlp")
        # Sixteen requests, one run of sixteen rows: the model process joined them.
        assert after["execution_count"] - before["execution_count"] == 1
        assert after["inference_count"] - before["inference_count"] == 16
        # Request counters are written by the workers (one file each once both answered).
        if len(list(folder.glob("counter_*.db"))) >= 2:
            break
    assert len(list(folder.glob("counter_*.db"))) >= 2, "only one worker ever answered"
    text = httpx.get(f"{server.url}/metrics").text
    line = next(li for li in text.splitlines() if li.startswith('onnxaccel_requests_total{code="200"'))
    assert float(line.split()[-1]) == sent
    assert 'onnxaccel_batch_size_count{model="mlp"}' in text
    # Where a batch's time goes, from the model process: joining the requests, then the run.
    for phase in ("join", "run"):
        line = next(li for li in text.splitlines()
                    if li.startswith(f'onnxaccel_batch_phase_seconds_count{{model="mlp",phase="{phase}"}}'))
        assert float(line.split()[-1]) >= 1


def test_large_tensors_pass_through_the_arena_intact(shared_server):
    server = shared_server
    rng = np.random.default_rng(7)
    images = rng.random((6, 3, 224, 224), dtype=np.float32)
    assert images[0].nbytes > INLINE_BYTES
    client = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"), concurrency=6)
    pending = []
    for i in range(6):  # one image per request, binary tensors
        value = tritonhttp.InferInput("image", [1, 3, 224, 224], "FP32")
        value.set_data_from_numpy(images[i:i + 1], binary_data=True)
        pending.append(client.async_infer("mean", [value]))
    results = [p.get_result().as_numpy("mean") for p in pending]
    for i, got in enumerate(results):
        np.testing.assert_allclose(got, images[i:i + 1].mean(axis=(2, 3)), rtol=1e-5)
    # A request of two rows goes through one arena slot too.
    value = tritonhttp.InferInput("image", [2, 3, 224, 224], "FP32")
    value.set_data_from_numpy(images[2:4], binary_data=True)
    np.testing.assert_allclose(client.infer("mean", [value]).as_numpy("mean"), images[2:4].mean(axis=(2, 3)),
                               rtol=1e-5)
    client.close()
    # The tensors went through the arenas: the model process maps both workers' arenas (their descriptors were
    # passed at connect), and the workers wrote the images there (their arena pages are resident).
    host = model_process(server)
    workers = [pid for pid in children(server.proc.pid) if pid != host]
    assert Path(f"/proc/{host}/maps").read_text().count("onnxaccel-arena") == 2
    assert sum(arena_rss(pid) for pid in workers) >= 6 * images[0].nbytes


def model_process(server) -> int:
    """The supervisor's child that runs the models: the only one with ONNX Runtime sessions."""
    found = [pid for pid in children(server.proc.pid)
             if "onnxruntime_pybind11_state" in Path(f"/proc/{pid}/maps").read_text()]
    assert len(found) == 1, found
    return found[0]


def arena_rss(pid: int) -> int:
    """Resident bytes of the onnxaccel arena mappings in a process (/proc/PID/smaps)."""
    total, inside = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef" and "-" in line.split()[0]:
            inside = "onnxaccel-arena" in line
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_load_and_unload_change_the_one_copy_and_every_worker_sees_it(shared_server):
    server = shared_server
    response = httpx.post(f"{server.url}/v2/repository/models/mean/unload")
    assert response.status_code == 200, response.text
    for _ in range(8):  # fresh connections: whichever worker answers, the model is gone
        assert httpx.get(f"{server.url}/v2/models/mean/ready").status_code != 200
        index = httpx.post(f"{server.url}/v2/repository/index", json={}).json()
        assert {m["name"]: m["state"] for m in index}["mean"] == "UNAVAILABLE"
    # Readiness in /metrics is the lowest over the live processes: 0 once any worker has the model unloaded.
    assert 'onnxaccel_model_ready{model="mean"} 0.0' in httpx.get(f"{server.url}/metrics").text
    response = httpx.post(f"{server.url}/v2/repository/models/mean/load")
    assert response.status_code == 200, response.text
    for _ in range(8):
        assert httpx.get(f"{server.url}/v2/models/mean/ready").status_code == 200
    # ... and 1 again only when every worker has been told the model is back.
    assert 'onnxaccel_model_ready{model="mean"} 1.0' in httpx.get(f"{server.url}/metrics").text
    response = httpx.post(f"{server.url}/v2/repository/models/nosuch/load")
    assert response.status_code == 404 and "nosuch" in response.json()["error"]


def test_a_killed_model_process_is_replaced_and_the_workers_reconnect(shared_server, mlp_path):
    import threading

    server = shared_server
    host = model_process(server)
    workers = sorted(pid for pid in children(server.proc.pid) if pid != host)
    body = mlp_body(np.ones((1, 4), dtype=np.float32))
    # A request waiting in the model process's queue (1.5 s delay) when it dies gets 503, not a hang.
    waiting = {}
    sender = threading.Thread(target=lambda: waiting.update(
        response=httpx.post(f"{server.url}/v2/models/mlp/infer", json=body, timeout=30)))
    sender.start()
    time.sleep(0.5)
    os.kill(host, signal.SIGKILL)
    sender.join(30)
    assert waiting["response"].status_code == 503, waiting["response"].text
    assert "model process" in waiting["response"].json()["error"]
    deadline = time.monotonic() + 90
    codes = []
    while time.monotonic() < deadline:
        response = httpx.post(f"{server.url}/v2/models/mlp/infer", json=body, timeout=30)
        codes.append(response.status_code)
        if response.status_code == 200 and len(codes) > 1:
            break
        assert response.status_code == 503, response.text  # while it restarts: unavailable, with a reason
        time.sleep(0.2)
    else:
        raise AssertionError(f"the model process did not come back: {codes}\n{server.log()}")
    assert "the model process" in server.log() and "status -9" in server.log()
    now = children(server.proc.pid)
    assert len(now) == 3 and host not in now
    assert sorted(pid for pid in now if pid != model_process(server)) == workers  # reconnected, not replaced
    assert server.stop(60) == 0


def test_arena_slots_wrap_and_come_back_in_any_order():
    arena = Arena(1024)
    try:
        a, b, c = arena.alloc(300), arena.alloc(300), arena.alloc(300)
        assert (a, b, c) == (0, 320, 640)  # 64-byte aligned
        assert arena.alloc(300) is None  # full: the caller sends the tensor inline
        arena.free(b)  # returned out of order: no room until the oldest is back
        assert arena.alloc(300) is None
        arena.free(a)
        assert arena.alloc(500) == 0  # wraps to the start, into the space of a and b
        assert arena.alloc(200) is None
        arena.free(c)
        assert arena.alloc(64) == 512
        assert arena.alloc(2048) is None  # larger than the arena
        arena.memory[0:4] = b"abcd"
        assert os.pread(arena.fd, 4, 0) == b"abcd"  # the memory is the descriptor's: what the model process maps
    finally:
        arena.close()


def test_messages_are_framed_whatever_the_chunks_they_arrive_in():
    """The model process reads length-prefixed pickles from a byte stream: any split of the stream into chunks
    gives the same messages, in order."""
    from onnxaccel.serve.model_host import _Worker
    from onnxaccel.serve.model_link import pack

    class Recorder:
        def __init__(self):
            self.messages = []

        def dispatch(self, worker, message):
            self.messages.append(message)

    messages = [("infer", i, "m", {"x": ("inline", np.full((2, 3), i, dtype=np.float32))}, 2, None)
                for i in range(5)] + [("load", 5, "m")]
    stream = b"".join(b"".join(pack(m)) for m in messages)
    for chunk in (1, 3, 7, 64, len(stream)):
        host = Recorder()
        worker = _Worker(host, None)
        for at in range(0, len(stream), chunk):
            worker.data_received(stream[at:at + chunk])
        assert [m[:3] for m in host.messages] == [m[:3] for m in messages]
        assert all(np.array_equal(got[3]["x"][1], want[3]["x"][1])
                   for got, want in zip(host.messages[:5], messages[:5]))
        assert not worker._buffer  # nothing left over


def test_a_model_process_that_cannot_start_ends_the_start_with_its_error(tmp_path):
    import subprocess
    import sys

    from tests.serve.conftest import SERVE

    empty = tmp_path / "repo"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-c", SERVE, "serve", str(empty), "--target", "cpu", "--workers", "2",
                           "--shared-models", "--http-port", "0", "--grpc-port", "0"],
                          capture_output=True, text=True, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Traceback" not in text
    assert "Model process" in text and "No models found" in text and "hint:" in text
