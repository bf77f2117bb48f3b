"""A response leaves in one write (http_protocol.py CoalescingTransport).

uvicorn writes a response's status line and headers, then its body, with a ``transport.write`` each: two send
calls and two segments per response. What must hold, on a real uvicorn server with onnxaccel's HTTP protocol
over real loopback sockets (the stdlib event loop, whose socket transport is Python and can be watched):
- each response of a keep-alive connection is sent by one call to the socket transport, and arrives whole;
- a response that closes its connection (``Connection: close``) still arrives whole before the end of stream.
"""

from __future__ import annotations

import asyncio.selector_events
import socket
import threading

import httpx
import pytest

from tests.serve.conftest import InProcess

uvicorn = pytest.importorskip("uvicorn")

BODY = bytes(range(256)) * 16  # 4 kB: a 1-row ResNet-50 answer


async def app(scope, receive, send):
    """Answers every request as onnxaccel's routes do (http_app.py _respond): a start message, then the body."""
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/octet-stream"), (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})


@pytest.fixture()
def sends(monkeypatch):
    """Every call to the stdlib socket transport's write and writelines, as the bytes each sent."""
    calls: list[bytes] = []
    transport = asyncio.selector_events._SelectorSocketTransport
    write, writelines = transport.write, transport.writelines
    inside = threading.local()  # Python 3.11's writelines joins and calls write: one call, not two

    def spy_write(self, data):
        if not getattr(inside, "writelines", False):
            calls.append(bytes(data))
        return write(self, data)

    def spy_writelines(self, chunks):
        chunks = list(chunks)
        calls.append(b"".join(bytes(c) for c in chunks))
        inside.writelines = True
        try:
            return writelines(self, chunks)
        finally:
            inside.writelines = False

    monkeypatch.setattr(transport, "write", spy_write)
    monkeypatch.setattr(transport, "writelines", spy_writelines)
    return calls


def test_each_response_of_a_keep_alive_connection_is_one_send(sends):
    with InProcess(app, loop="asyncio") as served, httpx.Client(base_url=f"http://127.0.0.1:{served.port}") as client:
        for _ in range(5):
            answer = client.post("/v2/models/m/infer", content=b"x" * 1000)
            assert answer.status_code == 200 and answer.content == BODY
    responses = [c for c in sends if c.startswith(b"HTTP/1.1 200")]
    assert len(responses) == 5 and len(sends) == 5, [c[:40] for c in sends]
    assert all(c.endswith(BODY) for c in responses)  # the status line, the headers and the body together


def test_a_response_that_closes_its_connection_arrives_whole(sends):
    with InProcess(app, loop="asyncio") as served, socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Length: 3\r\n\r\nabc")
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower()
    assert body == BODY
    assert len(sends) == 1
