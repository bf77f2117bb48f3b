"""Preallocated inference bodies (security.py BodyIntake, model_link.py ArenaBody; issue 22's serve speed).

What must hold, over real sockets:
- in process, a real uvicorn server with onnxaccel's protocol: a 602 kB binary request reaches the app as ONE
  message holding the whole body (not uvicorn's chunks, each copied again), in a decoding worker's arena when
  it has one, so its tensor is sent to the model process by offset, without a copy; its bytes are held in the
  in-flight budget while the request runs and given back after, with the arena slot;
- on a real `onnxaccel serve`: a large body sent slowly but steadily (each gap under --body-timeout, the whole
  body over it) is answered, a client expecting ``100-continue`` gets it, bodies cut off mid-way and refused
  requests give their bytes back (a budget one request wide still admits the next), and the answers are
  right, with one process and with --shared-models.
"""

from __future__ import annotations

import gc
import hashlib
import json
import socket
import time
import weakref
from pathlib import Path

import httpx
import numpy as np
import pytest

from onnxaccel.serve.arena import ARENA_BYTES, arena_bytes
from onnxaccel.serve.config import ServerConfig
from onnxaccel.serve.model_link import ModelLink
from onnxaccel.serve.protocol import decode_http_request
from onnxaccel.serve.http_protocol import ARENA_HOLD_S, BodyIntake, HeapBody
from onnxaccel.serve.security import HttpGuard, InflightBudget
from tests.serve.conftest import InProcess, ServerProcess
from tests.serve.test_limits import closed_by_server
from tests.serve.test_shared_models import make_mean

uvicorn = pytest.importorskip("uvicorn")
tritonhttp = pytest.importorskip("tritonclient.http")

MB = 1024 * 1024


def binary_body(image: np.ndarray, name: str = "image") -> tuple[bytes, int]:
    """A Triton binary-tensor request body (JSON header, then the raw tensor) and its header length."""
    head = json.dumps({"inputs": [{"name": name, "shape": list(image.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": image.nbytes}}]}).encode()
    return head + image.tobytes(), len(head)


def test_a_workers_arena_holds_every_body_its_in_flight_budget_admits():
    """Bodies past the arena went to the heap and their tensors through the model socket, pickled: with eight
    ResNet-50 rows a request (4.8 MB) the 128 MiB arena held 27 of the 55 bodies a 256 MiB budget admits."""
    config = ServerConfig(max_inflight_bytes=256 * 2**20)
    budget = InflightBudget(config.max_inflight_bytes)
    link = ModelLink("/nonexistent", on_models=lambda d: None, on_lost=lambda r: None,
                     arena_bytes=arena_bytes(config.max_inflight_bytes))
    assert link.arena is not None, "memfd_create and send_fds are Linux features this test needs"
    link._writer = object()  # connected, as far as body_memory is concerned
    header, size = 300, 8 * 3 * 224 * 224 * 4 + 300
    slots = []
    while budget.take(size):
        slot = link.body_memory(size, header)
        assert slot is not None, f"body {len(slots) + 1} of {config.max_inflight_bytes // size} found no arena slot"
        slots.append(slot)
    assert len(slots) == config.max_inflight_bytes // size == 55
    assert arena_bytes(0) == ARENA_BYTES  # a small budget keeps the smallest arena
    link.arena.close()


@pytest.mark.parametrize("arena", [True, False], ids=["arena", "heap"])
def test_a_binary_body_arrives_whole_in_preallocated_memory_and_goes_back(arena):
    config = ServerConfig()
    budget = InflightBudget(config.max_inflight_bytes)
    link = ModelLink("/nonexistent", on_models=lambda d: None, on_lost=lambda r: None)
    if arena:
        assert link.arena is not None, "memfd_create and send_fds are Linux features this test needs"
        link._writer = object()  # connected, as far as body_memory is concerned (no message is sent)
    seen = []

    async def app(scope, receive, send):
        messages = []
        while True:
            message = await receive()
            body = message.get("body", b"")
            messages.append((type(body).__name__, len(body), message.get("more_body", False)))
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        header = dict(scope["headers"]).get(b"inference-header-content-length")
        described, slots, same = {}, [], False
        if header is not None:
            request = decode_http_request("mean", "", body, header.decode())
            if link.arena is not None:
                described, slots = link._place(request.inputs)
        kind = described.get("image", ("none",))[0]
        offset = described["image"][1] if kind == "arena" else None
        if offset is not None:
            tensor = request.inputs["image"]
            same = link.arena.memory[offset:offset + tensor.nbytes] == tensor.tobytes()
        seen.append({"messages": messages, "kind": kind, "in_body": bool(slots) and not isinstance(slots[0], int),
                     "offset": offset, "same": same, "held": budget.used,
                     "extension": scope.get("extensions", {}).get("onnxaccel.preallocated_body")})
        link._free(slots)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    image = np.random.default_rng(3).random((1, 3, 224, 224), dtype=np.float32)
    body, head = binary_body(image)
    intake = BodyIntake(config, budget, link.body_memory if arena else None)
    with InProcess(HttpGuard(app, config, budget), intake) as server:
        response = httpx.post(f"{server.url}/v2/models/mean/infer", content=body,
                              headers={"Inference-Header-Content-Length": str(head)})
        assert response.status_code == 200, response.text
        small = httpx.post(f"{server.url}/v2/models/mean/infer", content=b"{}" + b" " * 100)
        assert small.status_code == 200
    got = seen[0]
    # One message with the whole body, held in the budget (once: the guard did not count it again).
    expected_type = "memoryview" if arena else "bytearray"
    assert got["messages"] == [(expected_type, len(body), False)], got["messages"]
    assert got["held"] == len(body) and got["extension"] == len(body)
    if arena:
        # The tensor was sent by its place in the body's slot (aligned), not copied to a new one.
        assert got["kind"] == "arena" and got["in_body"] and got["same"]
        assert got["offset"] % 64 == 0
        assert link.arena.used == 0  # the slot came back after the request and its message
        link.arena.close()
    assert budget.used == 0
    # A small body (under the 64 KiB of control routes) goes through uvicorn as before.
    assert seen[1]["extension"] is None and seen[1]["held"] == 0


@pytest.fixture(scope="module", params=["single", "shared"])
def mean_server(request, tmp_path_factory):
    """A real server for the mean model with a 1 s body timeout and an in-flight budget one request wide."""
    root = tmp_path_factory.mktemp(f"intake-{request.param}")
    repo = root / "repo"
    repo.mkdir()
    make_mean(repo / "mean.onnx")
    layout = ["--workers", "1", "--shared-models"] if request.param == "shared" else []
    proc = ServerProcess(repo, "--body-timeout", "1", "--max-request-mb", "1", "--max-inflight-mb", "1", *layout,
                         log=root / "serve.log")
    yield proc.wait_ready(120)
    assert proc.stop() == 0, proc.log()


def raw_request(server: ServerProcess, body: bytes, head: int, extra: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    sock.sendall(b"POST /v2/models/mean/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 + f"Content-Length: {len(body)}\r\nInference-Header-Content-Length: {head}\r\n".encode()
                 + extra + b"\r\n")
    return sock


def answer_of(raw: bytes) -> tuple[int, bytes]:
    status = int(raw.split(b" ", 2)[1])
    return status, raw.split(b"\r\n\r\n", 1)[1]


def mean_of(payload: bytes) -> np.ndarray:
    doc = json.loads(payload)
    return np.array(doc["outputs"][0]["data"], dtype=np.float32)


def assert_mean_answer(sock: socket.socket, image: np.ndarray) -> None:
    """The server's answer on ``sock`` is 200 with the image's channel means."""
    raw = closed_by_server(sock, within=10.0)
    sock.close()
    status, payload = answer_of(raw)
    assert status == 200, raw[:300]
    np.testing.assert_allclose(mean_of(payload), image.mean(axis=(2, 3)).ravel(), rtol=1e-5)


def send_slowly(server: ServerProcess, seed: int, gap_s: float) -> None:
    """A 602 kB image request sent in four parts ``gap_s`` apart; its answer must be right."""
    image = np.random.default_rng(seed).random((1, 3, 224, 224), dtype=np.float32)
    body, head = binary_body(image)
    sock = raw_request(server, body, head)
    step = len(body) // 4 + 1
    for i in range(0, len(body), step):
        if i:
            time.sleep(gap_s)
        sock.sendall(body[i:i + step])
    assert_mean_answer(sock, image)


def test_a_large_body_sent_slowly_but_steadily_is_answered(mean_server):
    """602 kB in four parts 0.6 s apart: each gap is under --body-timeout 1, the whole body is not (1.8 s)."""
    send_slowly(mean_server, seed=11, gap_s=0.6)


def test_progress_keeps_up_with_a_short_body_timeout(tmp_path):
    """--body-timeout 0.4: progress is shown at least every 0.1 s, so parts 0.25 s apart (0.75 s in all) pass."""
    make_mean(tmp_path / "mean.onnx")
    server = ServerProcess(tmp_path / "mean.onnx", "--body-timeout", "0.4", "--no-grpc", log=tmp_path / "serve.log")
    try:
        send_slowly(server.wait_ready(), seed=14, gap_s=0.25)
    finally:
        assert server.stop() == 0, server.log()


def test_a_client_expecting_100_continue_gets_it_then_its_answer(mean_server):
    image = np.random.default_rng(12).random((1, 3, 224, 224), dtype=np.float32)
    body, head = binary_body(image)
    sock = raw_request(mean_server, body, head, b"Expect: 100-continue\r\n")
    sock.settimeout(10)
    interim = sock.recv(1024)
    assert interim.startswith(b"HTTP/1.1 100"), interim
    sock.sendall(body)
    assert_mean_answer(sock, image)


def test_cut_off_and_refused_bodies_give_their_bytes_back(mean_server):
    """The budget holds one 602 kB body (--max-inflight-mb 1): after bodies cut off mid-way, stalled ones
    closed by the body timeout and refused ones, the next requests are still admitted and answered right."""
    image = np.random.default_rng(13).random((1, 3, 224, 224), dtype=np.float32)
    body, head = binary_body(image)
    for _ in range(3):  # cut off: the client leaves after half the body
        sock = raw_request(mean_server, body, head)
        sock.sendall(body[:len(body) // 2])
        sock.close()
        time.sleep(0.3)  # the server notices the close (a few turns of its loop), then gives the bytes back
    stalled = raw_request(mean_server, body, head)
    stalled.sendall(body[:1000])
    assert closed_by_server(stalled, within=5.0).startswith(b"HTTP/1.1 408")
    stalled.close()
    bad = raw_request(mean_server, body[:-4] + b"\0\0\0\0", head + 4)  # header length past the JSON: 400
    bad.sendall(body[:-4] + b"\0\0\0\0")
    assert answer_of(closed_by_server(bad, within=5.0))[0] == 400
    bad.close()
    client = tritonhttp.InferenceServerClient(mean_server.url.removeprefix("http://"))
    try:
        for i in range(5):
            value = tritonhttp.InferInput("image", [1, 3, 224, 224], "FP32")
            value.set_data_from_numpy(image * (i + 1), binary_data=True)
            got = client.infer("mean", [value]).as_numpy("mean")
            np.testing.assert_allclose(got, (image * (i + 1)).mean(axis=(2, 3)), rtol=1e-5)
    finally:
        client.close()


def test_a_second_body_while_the_budget_is_held_gets_503(mean_server):
    """Two 602 kB bodies at once do not fit a 1 MB budget: the second is refused before it is read."""
    image = np.zeros((1, 3, 224, 224), dtype=np.float32)
    body, head = binary_body(image)
    first = raw_request(mean_server, body, head)
    first.sendall(body[:1000])  # holds its bytes until the body timeout
    time.sleep(0.2)
    second = raw_request(mean_server, body, head)
    answer = closed_by_server(second, within=5.0)
    assert answer.startswith(b"HTTP/1.1 503") and b"--max-inflight-mb" in answer, answer[:200]
    second.close()
    assert closed_by_server(first, within=5.0).startswith(b"HTTP/1.1 408")
    first.close()


def test_the_server_log_is_clean(mean_server):
    text = Path(mean_server.log_path).read_text(errors="replace")
    assert "Traceback" not in text and "Exception in ASGI" not in text, text[-2000:]


def test_a_lost_model_process_frees_its_messages_slots_not_a_body_still_arriving():
    """When the model process goes, the slots of the messages it held come back; a body still being received in
    the arena keeps its slot (a reset of the whole arena let the next request's tensors overwrite it)."""
    link = ModelLink("/nonexistent", on_models=lambda d: None, on_lost=lambda r: None)
    assert link.arena is not None
    link._writer = object()
    try:
        body = link.body_memory(700_000, 100)  # a request whose body is still arriving
        body.view[:5] = b"hello"
        sent = link.arena.alloc(600_000)  # a message the model process holds

        class Pending:
            def done(self):
                return True

        link._pending[1] = (Pending(), [sent], "mean")
        link.inflight["mean"] += 1
        link._writer = None
        link._lost("gone")
        taken = []  # fill the whole arena: no slot may overlap the body's
        while (offset := link.arena.alloc(600_000)) is not None:
            taken.append(offset)
        assert len(taken) > 100
        assert all(o + 600_000 <= body.slot or o >= body.end for o in taken), "a slot overlaps the body"
        assert bytes(body.view[:5]) == b"hello"
        body.close()
        for offset in taken:
            link.arena.free(offset)
        assert link.arena.used == 0
    finally:
        link.arena.close()


class TrackedHeap(HeapBody):
    """Heap body memory that a test can watch die (a weak reference)."""


def recording_app(seen: list):
    """An app that reads the body and records its type and digest, then answers 200."""

    async def app(scope, receive, send):
        while True:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        body = message.get("body", b"")
        seen.append((type(body).__name__, hashlib.sha256(body).hexdigest()))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


def head_of(size: int) -> bytes:
    return (b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: 2\r\n"
            + f"Content-Length: {size}\r\n\r\n".encode())


def test_a_heap_body_is_freed_when_its_request_ends_on_a_kept_alive_connection():
    """The protocol keeps its last body object until the connection's next request (or its close, then the
    garbage collector): the memory must not stay with it (12 idle connections held 720 MB past the budget)."""
    config = ServerConfig()
    budget = InflightBudget(config.max_inflight_bytes)
    made = []

    def allocate(size, _header):
        made.append(TrackedHeap(size))
        return made[-1]

    seen = []
    with InProcess(HttpGuard(recording_app(seen), config, budget), BodyIntake(config, budget, allocate)) as server:
        with httpx.Client() as client:  # keeps its connection open after the response
            body = b"{}" + bytes(300_000)
            assert client.post(f"{server.url}/v2/models/m/infer", content=body,
                               headers={"Inference-Header-Content-Length": "2"}).status_code == 200
            watch = weakref.ref(made.pop())
            gc.disable()
            try:
                deadline = time.monotonic() + 5
                while watch() is not None and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert watch() is None, "the body's memory outlived its request"
            finally:
                gc.enable()
    assert seen == [("bytearray", hashlib.sha256(body).hexdigest())] and budget.used == 0


def test_a_body_still_arriving_leaves_the_arena_so_the_ring_is_not_blocked():
    """A body not complete within ARENA_HOLD_S moves to the heap and frees its arena slot at once; the request is
    answered from the heap with the same bytes. A fast body stays in the arena."""
    config = ServerConfig()
    budget = InflightBudget(config.max_inflight_bytes)
    link = ModelLink("/nonexistent", on_models=lambda d: None, on_lost=lambda r: None)
    assert link.arena is not None
    link._writer = object()
    seen = []
    body = b"{}" + np.random.default_rng(15).bytes(200_000)
    try:
        with InProcess(HttpGuard(recording_app(seen), config, budget),
                       BodyIntake(config, budget, link.body_memory)) as server:
            sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=10)
            sock.sendall(head_of(len(body)) + body[:50_000])
            time.sleep(0.2)
            assert link.arena.used == 1  # in the arena while it arrives
            time.sleep(ARENA_HOLD_S + 0.3)
            assert link.arena.used == 0  # moved to the heap: the slot is free for others
            sock.sendall(body[50_000:])
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")
            sock.close()
            fast = httpx.post(f"{server.url}/v2/models/m/infer", content=body,
                              headers={"Inference-Header-Content-Length": "2"})
            assert fast.status_code == 200
        digest = hashlib.sha256(body).hexdigest()
        assert seen == [("bytearray", digest), ("memoryview", digest)]
        assert link.arena.used == 0 and budget.used == 0
    finally:
        link.arena.close()


def test_progress_shown_late_is_not_lost():
    """--body-timeout 1: data at 0.2 s, the next 0.85 s later (each gap under the timeout) is answered; the
    progress of the first part, too early to show at once, is shown when its interval ends."""
    config = ServerConfig(body_timeout_s=1.0)
    budget = InflightBudget(config.max_inflight_bytes)
    seen = []
    with InProcess(HttpGuard(recording_app(seen), config, budget), BodyIntake(config, budget)) as server:
        sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), timeout=10)
        sock.sendall(head_of(100_000))
        time.sleep(0.2)
        sock.sendall(b"{}" + bytes(40_000))
        time.sleep(0.85)
        sock.sendall(bytes(59_998))
        answer = sock.recv(1024)
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert len(seen) == 1 and budget.used == 0
