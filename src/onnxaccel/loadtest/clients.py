"""The load generator's clients: a minimal keep-alive HTTP/1.1 client on asyncio streams, and gRPC with
pre-serialized messages. Both send one prepared request body over and over, as perf_analyzer does with its
default input data, so the client spends its time on the wire and not on encoding.

A general-purpose client (httpx, aiohttp) costs several times more CPU per request; at thousands of requests
per second the load generator, not the server, would be what is measured.

Requests are encoded with the wire format ``onnxaccel.serve`` defines (``serve.protocol``: datatypes and the
binary tensor extension; ``serve.grpc_messages``: the compiled Open Inference Protocol messages), so client
and server cannot disagree on it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np

from onnxaccel.serve.grpc_messages import messages
from onnxaccel.serve.protocol import HEADER_LENGTH, datatype_of, to_bytes


@dataclass(frozen=True)
class Payload:
    """One prepared inference request for a transport."""

    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]


def http_payload(model: str, inputs: dict[str, np.ndarray], binary: bool) -> Payload:
    """The protocol's JSON request, or JSON + binary tensors (binary outputs asked too)."""
    tensors, blobs = [], []
    for name, value in inputs.items():
        entry = {"name": name, "shape": list(value.shape), "datatype": datatype_of(value.dtype)}
        if binary:
            blob = to_bytes(value)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif value.dtype == object:  # BYTES in JSON: base64 (MLServer's content_type, serve/protocol.py)
            entry["parameters"] = {"content_type": "base64"}
            entry["data"] = [base64.b64encode(bytes(v)).decode() for v in value.reshape(-1)]
        else:
            entry["data"] = value.reshape(-1).tolist()
        tensors.append(entry)
    doc = {"inputs": tensors}
    if binary:
        doc["parameters"] = {"binary_data_output": True}
    head = json.dumps(doc, separators=(",", ":")).encode()
    headers = [("Content-Type", "application/octet-stream" if binary else "application/json")]
    if binary:
        headers.append((HEADER_LENGTH, str(len(head))))
    return Payload(f"/v2/models/{model}/infer", b"".join([head, *blobs]), tuple(headers))


def grpc_payload(model: str, inputs: dict[str, np.ndarray]) -> bytes:
    """A serialized ``ModelInferRequest`` with the inputs as raw contents (needs grpcio-tools, the serve extra)."""
    m = messages()
    request = m.ModelInferRequest(model_name=model)
    for name, value in inputs.items():
        request.inputs.add(name=name, datatype=datatype_of(value.dtype), shape=list(value.shape))
        request.raw_input_contents.append(to_bytes(value))
    return request.SerializeToString()


class HttpConnection:
    """One keep-alive connection; ``post`` returns (status, body). Reconnects when the server closes."""

    def __init__(self, url: str):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, payload: Payload) -> tuple[int, bytes]:
        """Send ``payload``; (status, body) of the answer. A dropped connection is closed and raised."""
        if self._writer is None:
            await self._open()
        head = [f"POST {payload.path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                f"Content-Length: {len(payload.body)}", *(f"{k}: {v}" for k, v in payload.headers), "", ""]
        self._writer.write("\r\n".join(head).encode() + payload.body)
        try:
            return await self._read_response()
        except (asyncio.IncompleteReadError, ConnectionError):
            await self.close()
            raise

    async def get(self, path: str) -> tuple[int, bytes]:
        """GET ``path``; (status, body)."""
        if self._writer is None:
            await self._open()
        self._writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n\r\n".encode())
        return await self._read_response()

    async def _read_response(self) -> tuple[int, bytes]:
        reader = self._reader
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        length, chunked, close = 0, False, False
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            key = key.strip().lower()
            if key == "content-length":
                length = int(value)
            elif key == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif key == "connection" and "close" in value.lower():
                close = True
        body = await self._read_chunked() if chunked else await reader.readexactly(length)
        if close:
            await self.close()
        return status, body

    async def _read_chunked(self) -> bytes:
        parts = []
        while True:
            size = int((await self._reader.readline()).split(b";")[0], 16)
            if size == 0:
                await self._reader.readline()
                return b"".join(parts)
            parts.append(await self._reader.readexactly(size))
            await self._reader.readline()

    async def close(self) -> None:
        """Close the connection; the next request opens a new one."""
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except (ConnectionError, OSError):
                pass
        self._reader = self._writer = None


class GrpcCaller:
    """``ModelInfer`` on one channel with pre-serialized requests; ``call`` returns the gRPC status name."""

    def __init__(self, address: str, max_message_bytes: int = 256 * 1024 * 1024):
        import grpc

        self._grpc = grpc
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        self.channel = grpc.aio.insecure_channel(address.removeprefix("grpc://"), options=options)
        # No serializers: the request is bytes already and the response is left as bytes.
        self._infer = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

    async def call(self, request: bytes, timeout: float) -> str:
        """Send one serialized request; "OK" or the gRPC status code's name."""
        try:
            await self._infer(request, timeout=timeout)
            return "OK"
        except self._grpc.aio.AioRpcError as exc:
            return exc.code().name

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()
