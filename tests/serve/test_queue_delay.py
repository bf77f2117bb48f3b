"""The adaptive queue delay (``--queue-delay adaptive``, the default) against ``fixed`` (Triton's), on a real server,
in one process and with ``--workers 2 --shared-models`` (the GPU default layout: the batcher is in the model
process, and the workers' requests on their way are counters in their arenas): a lone request runs at once
instead of waiting out ``--max-queue-delay-ms``; a request whose body is still arriving is waited for, so the two
run as one batch with the same rows an unbatched run gives; a bad value in a model's config.json is refused with
the choices.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from onnxaccel.errors import UsageError
from onnxaccel.serve.config import ModelConfig
from tests.conftest import make_mlp
from tests.serve.conftest import ServerProcess, write_config

DELAY_MS = 1500
LAYOUTS = {"one process": (), "shared models": ("--workers", "2", "--shared-models")}


def body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}]}


def executions(server, model: str = "mlp") -> int:
    return httpx.get(f"{server.url}/v2/models/{model}/stats").json()["model_stats"][0]["execution_count"]


def timed_request(server, x: np.ndarray, model: str = "mlp") -> tuple[float, list]:
    start = time.monotonic()
    response = httpx.post(f"{server.url}/v2/models/{model}/infer", json=body(x), timeout=30)
    assert response.status_code == 200, response.text
    return time.monotonic() - start, response.json()["outputs"][0]["data"]


POLICIES = ("adaptive", "fixed", "fill")


@pytest.fixture(scope="module", params=list(LAYOUTS))
def policy_server(request, tmp_path_factory):
    """One server per layout for the three policies: a repository of three mlp models whose config.json each sets
    its queue_delay (the per-model key; the flag gives the rest), max batch 8 and a 1.5 s delay."""
    root = tmp_path_factory.mktemp("policies")
    for policy in POLICIES:
        (root / policy).mkdir()
        make_mlp(root / policy / "model.onnx")
        write_config(root / policy, queue_delay=policy)
    server = ServerProcess(root, *LAYOUTS[request.param], "--max-batch", "8", "--max-queue-delay-ms", str(DELAY_MS),
                           "--no-grpc", log=root / "serve.log").wait_ready(120)
    try:
        yield server
    finally:
        assert server.stop(60) == 0, server.log()


@pytest.mark.parametrize("policy", POLICIES)
def test_a_lone_request_waits_the_delay_only_when_fixed(policy_server, policy):
    config = httpx.get(f"{policy_server.url}/v2/models/{policy}/config").json()
    assert config["parameters"]["queue_delay"] == {"string_value": policy}  # what the batcher applies
    x = np.array([[0.1, 0.2, 0.3, 0.4]], np.float32)
    timed_request(policy_server, x, policy)  # the first request of a model pays its own one-off costs
    seconds = min(timed_request(policy_server, x, policy)[0] for _ in range(3))
    if policy != "fixed":  # fill is adaptive too (one instance: nothing runs beside it)
        assert seconds < DELAY_MS / 1e3 / 3, f"a lone request took {seconds:.3f} s: it waited for company"
    else:
        assert seconds >= DELAY_MS / 1e3 * 0.9, f"{seconds:.3f} s: the fixed delay was not waited"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_request_whose_body_is_arriving_is_waited_for(tmp_path, mlp_path, layout):
    """Request B sends its headers, then its body 1.5 s later; request A, complete, arrives 0.5 s after B's
    headers. With the adaptive delay (5 s here) A's batch waits for B (on its way): both run in one execution,
    row for row as alone, and A is answered once B's body is in, long before the delay would have run out.
    With two workers, A and B may reach different ones: the model process sees B in the other's arena."""
    server = ServerProcess(mlp_path, *LAYOUTS[layout], "--max-batch", "8", "--max-queue-delay-ms", "5000",
                           "--no-grpc", log=tmp_path / "serve.log").wait_ready(120)
    session = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"])
    a, b = np.array([[0.1, 0.2, 0.3, 0.4]], np.float32), np.array([[0.9, -0.5, 0.25, 2.0]], np.float32)
    try:
        timed_request(server, a)
        before = executions(server)
        payload = json.dumps(body(b)).encode()
        slow = socket.create_connection(("127.0.0.1", server.http_port))
        slow.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n")
        answers: dict = {}

        def send_body_later():
            time.sleep(1.5)
            slow.sendall(payload)
            reply = b""
            while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < int(
                    reply.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]):
                reply += slow.recv(65536)
            answers["b"] = json.loads(reply.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"]

        thread = threading.Thread(target=send_body_later)
        thread.start()
        time.sleep(0.5)  # B's headers are in by now: B is on its way
        seconds, answers["a"] = timed_request(server, a)
        thread.join(30)
        slow.close()
        assert executions(server) - before == 1, "A ran before B's body arrived, or B ran alone"
        assert seconds < 4.0, f"A took {seconds:.3f} s: it waited out the 5 s delay instead of B's body"
        for name, x in (("a", a), ("b", b)):
            np.testing.assert_array_equal(np.array(answers[name], np.float32),
                                          session.run(None, {"x": x})[0].reshape(-1))
    finally:
        assert server.stop(60) == 0, server.log()


def test_a_bad_queue_delay_names_the_choices():
    with pytest.raises(UsageError) as bad:
        ModelConfig(name="m", source="m.onnx", queue_delay="sometimes")
    assert "queue_delay is 'sometimes'" in bad.value.message and "adaptive" in bad.value.hint
