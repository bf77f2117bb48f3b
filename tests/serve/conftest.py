"""A real `onnxaccel serve` in a subprocess on loopback, and a model repository of real models to serve."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_mlp

# The CLI's serve command on a local Typer app (cli/main.py registers it for the `onnxaccel` command).
SERVE = ("import typer\nfrom onnxaccel.cli import serve\napp = typer.Typer()\n"
         "app.callback()(lambda: None)\nserve.register(app)\napp()")


#: The server's words for a port another process holds (gRPC: the OS's error; HTTP: its own).
PORT_TAKEN = re.compile(r"address already in use|port \S+ is in use", re.IGNORECASE)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`onnxaccel serve SOURCE ARGS...` on free loopback ports; ``stop()`` sends SIGTERM and waits."""

    #: Starts again on new ports when another process took a free port before the server bound it.
    PORT_RETRIES = 3

    def __init__(self, source: str | Path, *args: str, log: Path, env: dict | None = None):
        self.source, self.args, self.env = source, args, env
        self.log_path = log
        self.retries = self.PORT_RETRIES
        self._start()

    def _start(self) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self._log = open(self.log_path, "wb")
        cmd = [sys.executable, "-c", SERVE, "serve", str(self.source), "--target", "cpu",
               "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port), *self.args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(self.env or {})})

    def wait_ready(self, timeout: float = 60.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log()
                # free_port() closes its socket before the server binds the port: between the two another process
                # of the machine may take it (a port race of the harness, not the server's behaviour).
                if PORT_TAKEN.search(log) and self.retries > 0:
                    self.retries -= 1
                    self._log.close()
                    self._start()
                    continue
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{log}")
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def write_config(folder: Path, **config) -> None:
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory, pretrained_cls) -> Path:
    """mlp (batches, x[N,4] fp32), cls (PP-OCR classifier, batches up to 4), fixed (x[2,4]: no batch axis to
    join on), broken (not an ONNX file: fails to load), echo (string in, string out: BYTES tensors)."""
    root = tmp_path_factory.mktemp("repo")
    for name in ("mlp", "cls", "fixed", "broken", "echo"):
        (root / name).mkdir()
    make_echo(root / "echo" / "model.onnx")
    make_mlp(root / "mlp" / "model.onnx")
    write_config(root / "mlp", max_batch=16, max_queue_delay_ms=20)
    (root / "cls" / "model.onnx").write_bytes(Path(pretrained_cls).read_bytes())
    write_config(root / "cls", max_batch=4, max_queue_delay_ms=5)
    make_mlp(root / "fixed" / "model.onnx", batch=2)
    (root / "broken" / "model.onnx").write_bytes(b"this is not an onnx model")
    return root


@pytest.fixture(scope="session")
def server(model_repo, tmp_path_factory):
    """One server for the protocol tests (read-mostly; tests that unload models reload them)."""
    proc = ServerProcess(model_repo, "--max-request-mb", "4", "--model-control", "explicit", "--shared-memory", "system",
                         log=tmp_path_factory.mktemp("logs") / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        code = proc.stop()
        assert code == 0, proc.log()


def make_echo(path: Path) -> Path:
    """text[n] (ONNX string) -> Identity -> echo[n]: a model with BYTES tensors."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["text"], ["echo"])], "echo",
                              [helper.make_tensor_value_info("text", TensorProto.STRING, ["n"])],
                              [helper.make_tensor_value_info("echo", TensorProto.STRING, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


class InProcess:
    """A real uvicorn server on loopback in a thread, with onnxaccel's HTTP protocol (``intake``: its preallocated
    bodies) and ``app``; ``loop="asyncio"`` for the stdlib event loop, whose socket transport is Python."""

    def __init__(self, app, intake=None, loop: str = "auto"):
        import uvicorn

        from onnxaccel.serve.http_protocol import http_protocol_class

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False, loop=loop,
                                http=http_protocol_class(5.0, 65536, intake))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
