"""The serve tests' harness (tests/serve/conftest.py ServerProcess) starts again on new ports when a port it chose
was taken before the server bound it: free_port() closes its socket before the server binds, and on a busy
machine another process can take the port in between. Only that failure is retried."""

from __future__ import annotations

import socket

import httpx

from tests.serve import conftest


def test_a_port_taken_between_choice_and_bind_gets_a_new_port(tmp_path, mlp_path, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real = conftest.free_port
    ports = iter([port])
    monkeypatch.setattr(conftest, "free_port", lambda: next(ports, None) or real())
    try:
        server = conftest.ServerProcess(mlp_path, log=tmp_path / "serve.log")
        try:
            server.wait_ready(120)
            assert server.http_port != port and server.retries == conftest.ServerProcess.PORT_RETRIES - 1
            assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
        finally:
            server.stop()
    finally:
        taken.close()
