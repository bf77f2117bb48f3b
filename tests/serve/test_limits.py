"""Connection discipline on a real server on loopback (issue 21 items 1-4, 6, 9): slow-header and slow-body
clients are closed after their timeouts while good requests keep being answered, bodies are held against one
in-flight budget and a per-route limit, duplicated outputs come back once, hostile JSON and shapes get 400, and
the server's RSS (read from /proc/PID/status) stays under the bound docs/SECURITY.md gives. Every load loop is
bounded in count and time."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest

from tests.conftest import make_mlp
from tests.serve.conftest import ServerProcess

MB = 1024 * 1024
X = [0.5, 0.1, 0.2, 0.3]
GOOD = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X}]}


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """The default limits, with header and body timeouts of 1 s so the tests stay short."""
    root = tmp_path_factory.mktemp("limits")
    make_mlp(root / "mlp.onnx")
    proc = ServerProcess(root / "mlp.onnx", "--header-timeout", "1", "--body-timeout", "1", log=root / "server.log")
    yield proc.wait_ready()
    assert proc.stop() == 0, proc.log()


class RssSampler:
    """The server's peak VmRSS while a block runs, sampled every 20 ms (bounded by the block's length)."""

    def __init__(self, server: ServerProcess):
        self.server, self.peak, self._stop = server, 0, threading.Event()

    def __enter__(self):
        self.base = self.server.rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.server.rss_bytes())
            time.sleep(0.02)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.server.rss_bytes())

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / MB


def connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.http_port), timeout=10)


def closed_by_server(sock: socket.socket, within: float) -> bytes | None:
    """What the server sent before closing the connection (b'' for a bare close), or None when it did not
    close it within ``within`` seconds."""
    sock.settimeout(within)
    data = b""
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except (TimeoutError, socket.timeout):
        return None
    except ConnectionResetError:
        return data
    return None


def good_request_latency(server: ServerProcess) -> float:
    start = time.monotonic()
    response = httpx.post(f"{server.url}/v2/models/mlp/infer", json=GOOD, timeout=10)
    assert response.status_code == 200, response.text
    return time.monotonic() - start


def test_slow_header_clients_are_closed_and_good_requests_keep_being_answered(limited):
    """250 connections that send a partial request line and headers (and 20 that send nothing) are all closed
    with 408 within the 1 s header timeout + slack; meanwhile good requests keep getting 200 quickly."""
    socks = []
    with RssSampler(limited) as rss:
        for i in range(250):
            sock = connect(limited)
            sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\n")
            socks.append(sock)
        socks += [connect(limited) for _ in range(20)]
        latencies = [good_request_latency(limited) for _ in range(10)]
        outcomes = [closed_by_server(s, within=4.0) for s in socks]
    for sock in socks:
        sock.close()
    assert all(o is not None for o in outcomes), f"{sum(o is None for o in outcomes)} connections left open"
    assert sum(o.startswith(b"HTTP/1.1 408") for o in outcomes) >= 250
    assert max(latencies) < 1.0 + 0.5  # normal latency plus at most the header timeout
    print(f"peak RSS growth {rss.growth_mb:.1f} MB")  # the figure docs/SECURITY.md quotes (pytest -s)
    assert rss.growth_mb < 100, rss.growth_mb
    good_request_latency(limited)


def test_an_unfinished_body_is_closed_after_the_body_timeout(limited):
    """Bodies that stop (a few bytes of a declared 1 MB) get 408 and a close; a body sent slowly but steadily
    (each gap under the timeout) is answered normally."""
    socks = []
    for _ in range(30):
        sock = connect(limited)
        sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000\r\n\r\n{\"inputs\": [")
        socks.append(sock)
    good_request_latency(limited)
    outcomes = [closed_by_server(s, within=5.0) for s in socks]
    for sock in socks:
        sock.close()
    assert all(o is not None and o.startswith(b"HTTP/1.1 408") for o in outcomes), outcomes[:3]
    assert b"--body-timeout" in outcomes[0]

    body = json.dumps(GOOD).encode()
    sock = connect(limited)
    sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
    for i in range(0, len(body), len(body) // 3 + 1):
        time.sleep(0.5)
        sock.sendall(body[i:i + len(body) // 3 + 1])
    answer = closed_by_server(sock, within=5.0)
    sock.close()
    assert answer is not None and answer.startswith(b"HTTP/1.1 200"), answer


def _send_partial_body(server: ServerProcess, declared: int, send: int, path: str = "/v2/models/mlp/infer",
                       extra: bytes = b"Inference-Header-Content-Length: 2\r\n") -> socket.socket:
    sock = connect(server)
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n").encode() + extra + b"\r\n"
    try:
        sock.sendall(head)
        chunk = b"\0" * MB
        for _ in range(send // MB):
            sock.sendall(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused and closed by the server before the whole body went
    return sock


def test_held_bodies_stay_within_the_inflight_budget(limited):
    """24 connections each sending 63 MB of a declared 64 MB body and stopping held 1.87 GB: now at most
    --max-inflight-mb (256 MB) is admitted, the rest get 503 with Retry-After before their body is read."""
    with RssSampler(limited) as rss:
        socks = [_send_partial_body(limited, 64 * MB, 63 * MB) for _ in range(24)]
        good_request_latency(limited)
        answers = [closed_by_server(s, within=5.0) for s in socks]
    for sock in socks:
        sock.close()
    refused = [a for a in answers if a and a.startswith(b"HTTP/1.1 503")]
    assert len(refused) >= 24 - 4, [a[:40] if a else a for a in answers]
    assert all(b"retry-after: 1" in a.lower() for a in refused)
    assert all(a is not None for a in answers)  # the admitted ones end at the body timeout
    print(f"peak RSS growth {rss.growth_mb:.1f} MB")  # the figure docs/SECURITY.md quotes (pytest -s)
    assert rss.growth_mb < 400, f"RSS grew {rss.growth_mb:.0f} MB (bound 400)"


def test_a_large_json_body_is_refused_before_it_is_parsed(limited):
    """62 MB of JSON zeros peaked at +690 MB before its 400: all-JSON bodies are capped at --max-json-mb (16)."""
    zeros = b'{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[' + b"0," * (31 * MB) + b'0]}]}'
    with RssSampler(limited) as rss:
        response = httpx.post(f"{limited.url}/v2/models/mlp/infer", content=zeros,
                              headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 413
    assert "--max-json-mb" in response.json()["error"]
    print(f"peak RSS growth {rss.growth_mb:.1f} MB")  # the figure docs/SECURITY.md quotes (pytest -s)
    assert rss.growth_mb < 100, rss.growth_mb


@pytest.mark.parametrize("path", ["/v2/repository/index", "/v2/repository/models/mlp/load",
                                  "/v2/repository/models/mlp/unload", "/v2/models/mlp", "/v2/health/ready"])
def test_every_route_has_a_body_limit(limited, path):
    """/v2/repository/index read a 1 GiB body (RSS +2 GB): every route other than inference takes at most 64 KiB,
    refused from Content-Length before reading, and counted as it arrives when chunked."""
    method = "GET" if path in ("/v2/models/mlp", "/v2/health/ready") else "POST"
    sock = connect(limited)
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {2**30}\r\n\r\n".encode() + b"{" * 1024)
    answer = closed_by_server(sock, within=5.0)
    sock.close()
    assert answer is not None and answer.startswith(b"HTTP/1.1 413"), answer
    chunked = httpx.post(f"{limited.url}{path}", content=iter([b" " * 65536, b" " * 65536]), timeout=10) \
        if method == "POST" else None
    if chunked is not None and path.endswith("unload"):  # answered (403: control off) without reading the body
        assert chunked.status_code == 403 and chunked.headers["connection"] == "close"
    elif chunked is not None:
        assert chunked.status_code == 413, chunked.text
    assert httpx.post(f"{limited.url}/v2/repository/index", json={"ready": True}).status_code == 200


def test_duplicate_output_names_come_back_once(limited):
    """A request naming one output 10,000 times got a 219 MB response: each output is returned once."""
    body = {**GOOD, "outputs": [{"name": "probs"}] * 10_000}
    start = time.monotonic()
    response = httpx.post(f"{limited.url}/v2/models/mlp/infer", json=body, timeout=30)
    assert response.status_code == 200
    assert [o["name"] for o in response.json()["outputs"]] == ["probs"]
    assert len(response.content) < 2000 and time.monotonic() - start < 2


def test_hostile_json_and_shapes_get_400(limited):
    url = f"{limited.url}/v2/models/mlp/infer"
    deep = httpx.post(url, content=b"[" * 100_000, headers={"Content-Type": "application/json"})
    assert deep.status_code == 400 and "nests too deep" in deep.json()["error"]
    huge = {"inputs": [{"name": "x", "shape": [4611686018427387904, 0, 224, 224], "datatype": "FP32", "data": []}]}
    response = httpx.post(url, json=huge)
    assert response.status_code == 400 and "multiply past" in response.json()["error"]
    deep_index = httpx.post(f"{limited.url}/v2/repository/index", content=b"[" * 60_000)
    assert deep_index.status_code == 400


def test_grpc_shape_overflow_is_invalid_argument(limited):
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException

    client = tg.InferenceServerClient(limited.grpc_url)
    tensor = tg.InferInput("x", [4611686018427387904, 0, 224, 224], "FP32")
    tensor._raw_content = b""  # set by hand: set_data_from_numpy checks the shape itself
    with pytest.raises(InferenceServerException) as failed:
        client.infer("mlp", [tensor])
    assert failed.value.status() == "StatusCode.INVALID_ARGUMENT", failed.value
    client.close()


def test_draining_503_carries_retry_after_and_queue_gauge_returns_to_zero(tmp_path):
    """The 503s of a draining server carry Retry-After; onnxaccel_queue_length is 0 once requests that timed
    out in the queue are gone (it stayed at 12)."""
    make_mlp(tmp_path / "mlp.onnx")
    server = ServerProcess(tmp_path / "mlp.onnx", "--max-batch", "64", "--max-queue-delay-ms", "1500",
                           "--queue-delay", "fixed",  # every request waits in the queue past its timeout
                           "--timeout-ms", "200", "--no-grpc", log=tmp_path / "server.log").wait_ready()
    url = f"{server.url}/v2/models/mlp/infer"

    def many(count: int, out: list) -> None:
        threads = [threading.Thread(target=lambda: out.append(httpx.post(url, json=GOOD, timeout=30).status_code))
                   for _ in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)

    timed_out: list = []
    many(12, timed_out)
    assert timed_out.count(503) == 12
    time.sleep(2)  # the batcher's delay passes and the dropped requests leave its queue
    metrics = httpx.get(f"{server.url}/metrics").text
    gauge = [line for line in metrics.splitlines() if line.startswith('onnxaccel_queue_length{model="mlp"}')]
    assert gauge and float(gauge[0].split()[-1]) == 0.0, gauge

    slow = []
    waiting = threading.Thread(target=lambda: slow.append(
        httpx.post(url, json={**GOOD, "parameters": {"timeout": 10_000_000}}, timeout=30)))
    waiting.start()
    time.sleep(0.3)
    server.proc.send_signal(15)
    time.sleep(0.3)
    refused = httpx.post(url, json=GOOD, timeout=10)
    assert refused.status_code == 503 and refused.headers.get("retry-after") == "1"
    waiting.join(30)
    assert slow and slow[0].status_code == 200
    assert server.stop() == 0, server.log()


def _rejected(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    found = {}
    for line in text.splitlines():
        if line.startswith("onnxaccel_rejected_requests_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            found[reason] = float(line.rsplit(" ", 1)[1])
    return found


def test_refusals_before_any_model_reach_metrics(limited):
    """Refusals by the body limit and the header timeout never reached /metrics: an operator saw nothing of an
    attack the guards were holding off."""
    before = _rejected(limited)
    sock = connect(limited)
    sock.sendall(f"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: {2**30}\r\n\r\n".encode())
    assert (closed_by_server(sock, within=5.0) or b"").startswith(b"HTTP/1.1 413")
    sock.close()
    slow = connect(limited)
    slow.sendall(b"GET /v2/health/live HTTP/1.1\r\n")  # and no more: the header timeout (1 s) closes it
    assert (closed_by_server(slow, within=5.0) or b"").startswith(b"HTTP/1.1 408")
    slow.close()
    after = _rejected(limited)
    assert after.get("body_too_large", 0) >= before.get("body_too_large", 0) + 1, after
    assert after.get("header_timeout", 0) >= before.get("header_timeout", 0) + 1, after


def test_health_probes_answer_while_slow_clients_hold_every_connection(tmp_path):
    """1,030 connections sending headers slowly made every route answer 503, /v2/health/live included: a kubelet
    would restart a server that was only holding an attack off. Past --max-connections the probes still answer;
    other routes get 503, counted in /metrics."""
    make_mlp(tmp_path / "mlp.onnx")
    proc = ServerProcess(tmp_path / "mlp.onnx", "--max-connections", "4", "--header-timeout", "30",
                         log=tmp_path / "server.log").wait_ready()
    held = []
    try:
        for _ in range(6):
            sock = connect(proc)
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")  # the headers never end
            held.append(sock)
        time.sleep(0.3)
        assert httpx.get(f"{proc.url}/v2/health/live").status_code == 200
        assert httpx.get(f"{proc.url}/v2/health/ready").status_code == 200
        assert httpx.get(f"{proc.url}/v2/models/mlp").status_code == 503
        for sock in held:
            sock.close()
        held.clear()
        time.sleep(0.3)
        assert _rejected(proc).get("connections", 0) >= 1
    finally:
        for sock in held:
            sock.close()
        assert proc.stop() == 0, proc.log()


@pytest.mark.parametrize("path", ["/v2/repository/index", "/v2/models/mlp/infer"])
def test_a_body_trickled_within_the_read_timeout_still_ends_at_the_deadline(tmp_path, path):
    """A body sent a byte every 0.5 s never trips --body-timeout (1 s here): --body-deadline bounds it in all."""
    make_mlp(tmp_path / "mlp.onnx")
    proc = ServerProcess(tmp_path / "mlp.onnx", "--body-timeout", "1", "--body-deadline", "2",
                         log=tmp_path / "server.log").wait_ready()
    try:
        sock = connect(proc)
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: 100\r\n\r\n".encode())
        started, answer = time.monotonic(), None
        sock.settimeout(0.5)
        while time.monotonic() - started < 8:
            try:
                sock.sendall(b" ")
                data = sock.recv(65536)
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            answer = data + (closed_by_server(sock, within=2.0) or b"")  # the rest, up to the close
            break
        sock.close()
        assert answer is not None and answer.startswith(b"HTTP/1.1 408"), answer
        assert b"--body-deadline" in answer and time.monotonic() - started < 5
    finally:
        assert proc.stop() == 0, proc.log()


def test_grpc_messages_hold_the_same_inflight_budget(tmp_path):
    """The in-flight budget was HTTP's only: 24 concurrent 64 MB gRPC messages added 1.9 GB. Now a gRPC message
    holds the same budget as HTTP bodies: while an HTTP body holds most of it, a 1 MiB message is refused with
    RESOURCE_EXHAUSTED (counted in /metrics); once the body has gone, the same message passes the budget."""
    tritongrpc = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    make_mlp(tmp_path / "mlp.onnx")
    proc = ServerProcess(tmp_path / "mlp.onnx", "--max-request-mb", "4", "--max-inflight-mb", "4",
                         "--body-timeout", "30", log=tmp_path / "server.log").wait_ready()
    try:
        client = tritongrpc.InferenceServerClient(proc.grpc_url)

        def infer(rows):
            x = np.ones((rows, 4), dtype=np.float32)
            tensor = tritongrpc.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            with pytest.raises(InferenceServerException) as caught:
                client.infer("mlp", [tensor])
            return caught.value

        holder = _send_partial_body(proc, 3 * MB + MB // 2, 2 * MB)  # holds 3.5 MiB of the 4 until it ends
        time.sleep(0.3)
        refused = infer(65536)  # 1 MiB
        assert refused.status() == "StatusCode.RESOURCE_EXHAUSTED", refused
        assert "--max-inflight-mb" in refused.message()
        assert _rejected(proc).get("inflight_budget", 0) >= 1
        holder.close()
        time.sleep(0.5)
        passed = infer(65536)  # within the budget now: refused only for its batch size, by the model's check
        assert passed.status() == "StatusCode.INVALID_ARGUMENT" and "max_batch" in passed.message()
    finally:
        assert proc.stop() == 0, proc.log()
