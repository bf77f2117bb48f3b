"""The Open Inference Protocol over HTTP (FastAPI), plus the Triton endpoints existing clients call.

Routes and status codes: kserve/open-inference-protocol specification/protocol/inference_rest.md and
open_inference_rest.yaml (health: 200 true, 4xx false; errors ``{"error": "..."}``); Triton's extensions
(triton-inference-server/server docs/protocol/extension_model_repository.md, extension_statistics.md,
extension_model_configuration.md, extension_shared_memory.md) for repository index/load/unload, statistics,
model config and system shared memory (serve/shared_memory.py; CUDA shared memory registers nothing).

The inference route reads the raw body itself (no pydantic model): binary requests are not JSON, and parsing
a large JSON body twice would cost more than the model run on a GPU. Its schema is declared for the OpenAPI
document by hand. Its requests are answered by ``InferRoute``, a plain ASGI middleware in front of FastAPI's
routing, dependency solving and Request objects: under load the event loop's time per request is what limits
a server process, and that layer took about 15 % of it (py-spy, CPU). The FastAPI route stays for the OpenAPI
document and for any request the middleware does not take.
"""


import asyncio
import json
import re
import time
import zlib

from onnxaccel.errors import MissingDependencyError
from onnxaccel.serve.core import InferenceService
from onnxaccel.serve.protocol import (
    HEADER_LENGTH, ProtocolError, decode_http_request, encode_http_response, parse_json,
)
from onnxaccel.serve.security import HttpGuard, InflightBudget
from onnxaccel.serve.peer import http_peer
from onnxaccel.serve.shared_memory import CUDA_REFUSED

_ERROR = {"content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "string"}},
                                                      "required": ["error"]}}}}
ERRORS = {400: {"description": "Bad request", **_ERROR}, 404: {"description": "Unknown model or version", **_ERROR},
          503: {"description": "Not ready, shutting down, or overloaded", **_ERROR}}
CONTROL_ERRORS = {**ERRORS, 403: {"description": "The repository control API is off (--model-control explicit "
                                                 "turns it on)", **_ERROR}}
INFER_ERRORS = {**ERRORS, 413: {"description": "Request too large", **_ERROR},
                429: {"description": "The model's queue is full", **_ERROR}}
_TENSOR = {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
    "name": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "datatype": {"type": "string"}, "parameters": {"type": "object"},
    "data": {"type": "array", "items": {}}}}
INFER_REQUEST = {"type": "object", "required": ["inputs"], "properties": {
    "id": {"type": "string"}, "parameters": {"type": "object"},
    "inputs": {"type": "array", "items": _TENSOR},
    "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "parameters": {"type": "object"}}}}}}
INFER_RESPONSE = {"type": "object", "required": ["model_name", "outputs"], "properties": {
    "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
    "parameters": {"type": "object"}, "outputs": {"type": "array", "items": _TENSOR}}}
INFER_OPENAPI = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": INFER_REQUEST},
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
_JSON_OK = {"content": {"application/json": {"schema": {"type": "object"}}}}
_REGIONS = {200: {"description": "Registered regions", "content": {"application/json": {"schema": {
    "type": "array", "items": {"type": "object", "required": ["name", "key", "offset", "byte_size"], "properties": {
        "name": {"type": "string"}, "key": {"type": "string"}, "offset": {"type": "integer"},
        "byte_size": {"type": "integer"}}}}}}}, **ERRORS}
REGISTER_OPENAPI = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["key", "byte_size"], "properties": {
        "key": {"type": "string"}, "offset": {"type": "integer", "minimum": 0},
        "byte_size": {"type": "integer", "minimum": 1}}}}}}}


def create_app(service: InferenceService, budget: InflightBudget | None = None, *, guard: bool = True):
    """The FastAPI application serving the Open Inference Protocol over HTTP for ``service``; with ``guard``,
    InferRoute and HttpGuard (sharing ``budget``) as its middleware (server_app puts them in front instead)."""
    try:
        from fastapi import FastAPI, Request
        from fastapi.exceptions import RequestValidationError
        from fastapi.responses import JSONResponse, Response
        from starlette.exceptions import HTTPException as StarletteHTTPException
    except ImportError as exc:
        raise MissingDependencyError("fastapi", "serve", "The HTTP server") from exc

    app = FastAPI(title="onnxaccel inference server", version="2",
                  description="Open Inference Protocol (KServe v2) with Triton's binary tensor, model repository, "
                              "statistics, model configuration and system shared memory extensions.")
    limit = service.config.max_request_bytes
    if guard:
        app.add_middleware(InferRoute, service=service)
        # Added last, so outermost: auth, body limits, in-flight budget and body timeout come before any route.
        app.add_middleware(HttpGuard, config=service.config, budget=budget, on_reject=service.metrics.reject)

    @app.exception_handler(ProtocolError)
    async def protocol_error(_request, exc: ProtocolError):
        headers = {"Retry-After": str(int(exc.retry_after))} if exc.retry_after else None
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, exc: StarletteHTTPException):  # unknown route, wrong method: the protocol's body
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request, exc: RequestValidationError):
        return JSONResponse({"error": f"Invalid request: {exc.errors()}"}, status_code=400)

    def flag(ok: bool, key: str, status_false: int = 400):
        return JSONResponse({key: ok}, status_code=200 if ok else status_false)

    @app.get("/v2/health/live", responses={400: {"description": "Not live"}}, tags=["health"])
    async def health_live():
        return flag(service.live(), "live")

    @app.get("/v2/health/ready", responses={400: {"description": "Not ready"}}, tags=["health"])
    async def health_ready():  # the status is the protocol's answer; the body says why not (readiness)
        body = service.readiness()
        return JSONResponse(body, status_code=200 if body["ready"] else 400)

    @app.get("/v2", tags=["metadata"])
    async def server_metadata():
        return service.server_metadata()

    app.add_api_route("/v2/", server_metadata, methods=["GET"], include_in_schema=False)

    # Before /v2/models/{model_name}, which would take "stats" for a model's name (tritonclient's
    # get_inference_statistics() without a model got 404 "Unknown model 'stats'").
    @app.get("/v2/models/stats", responses=ERRORS, tags=["triton"])
    async def all_stats():
        return service.model_stats()

    @app.get("/v2/models/{model_name}", responses=ERRORS, tags=["metadata"])
    @app.get("/v2/models/{model_name}/versions/{model_version}", responses=ERRORS, tags=["metadata"])
    async def model_metadata(model_name: str, model_version: str = ""):
        return service.model_metadata(model_name, model_version)

    @app.get("/v2/models/{model_name}/ready", responses=ERRORS, tags=["health"])
    @app.get("/v2/models/{model_name}/versions/{model_version}/ready", responses=ERRORS, tags=["health"])
    async def model_ready(model_name: str, model_version: str = ""):
        ok = service.model_ready(model_name, model_version)
        return JSONResponse({"name": model_name, "ready": ok}, status_code=200 if ok else 400)

    @app.get("/v2/models/{model_name}/config", responses=ERRORS, tags=["triton"])
    @app.get("/v2/models/{model_name}/versions/{model_version}/config", responses=ERRORS, tags=["triton"])
    async def model_config(model_name: str, model_version: str = ""):
        return service.model_config(model_name, model_version)

    @app.get("/v2/models/{model_name}/stats", responses=ERRORS, tags=["triton"])
    @app.get("/v2/models/{model_name}/versions/{model_version}/stats", responses=ERRORS, tags=["triton"])
    async def model_stats(model_name: str, model_version: str = ""):
        return service.model_stats(model_name, model_version)

    @app.post("/v2/repository/index", responses=ERRORS, tags=["repository"])
    async def repository_index(request: Request):
        doc = _json_body(await request.body())
        ready_only = bool(doc.get("ready", False)) if isinstance(doc, dict) else False
        return service.repository.index(ready_only)

    @app.post("/v2/repository/models/{model_name}/load", responses=CONTROL_ERRORS, tags=["repository"])
    async def repository_load(model_name: str, request: Request):
        doc = _json_body(await request.body())
        params = doc.get("parameters") if isinstance(doc, dict) else None
        service.check_load_parameters(model_name, params if isinstance(params, dict) else {})
        await service.load(model_name)
        return {}

    @app.post("/v2/repository/models/{model_name}/unload", responses=CONTROL_ERRORS, tags=["repository"])
    async def repository_unload(model_name: str):
        await service.unload(model_name)
        return {}

    @app.get("/v2/systemsharedmemory/status", responses=_REGIONS, tags=["shared memory"])
    @app.get("/v2/systemsharedmemory/region/{name}/status", responses=_REGIONS, tags=["shared memory"])
    async def shm_status(request: Request, name: str = ""):
        return service.shared_memory(lambda: http_peer(request.scope)).status(name)

    @app.post("/v2/systemsharedmemory/region/{name}/register", responses=ERRORS, tags=["shared memory"],
              openapi_extra=REGISTER_OPENAPI)
    async def shm_register(name: str, request: Request):
        regions = service.shared_memory(lambda: http_peer(request.scope))
        regions.register_body(name, _json_body(await request.body()))
        return {}

    @app.post("/v2/systemsharedmemory/unregister", responses=ERRORS, tags=["shared memory"])
    @app.post("/v2/systemsharedmemory/region/{name}/unregister", responses=ERRORS, tags=["shared memory"])
    async def shm_unregister(request: Request, name: str = ""):
        service.shared_memory(lambda: http_peer(request.scope)).unregister(name)
        return {}

    # CUDA shared memory is not offered: a register is refused; the status lists no region and an unregister has
    # nothing to do (perf_analyzer --shared-memory system unregisters every CUDA region too, see SERVING.md).
    @app.get("/v2/cudasharedmemory/status", responses=ERRORS, tags=["shared memory"])
    @app.get("/v2/cudasharedmemory/region/{name}/status", responses=ERRORS, tags=["shared memory"])
    async def cuda_status(name: str = ""):
        if name:
            raise ProtocolError(400, f"No CUDA shared memory region '{name}' is registered. {CUDA_REFUSED}")
        return []

    @app.post("/v2/cudasharedmemory/region/{name}/register", responses=ERRORS, tags=["shared memory"])
    async def cuda_register(name: str):
        raise ProtocolError(400, CUDA_REFUSED)

    @app.post("/v2/cudasharedmemory/unregister", responses=ERRORS, tags=["shared memory"])
    @app.post("/v2/cudasharedmemory/region/{name}/unregister", responses=ERRORS, tags=["shared memory"])
    async def cuda_unregister(name: str = ""):
        return {}

    async def infer(model_name: str, request: Request, model_version: str = ""):
        start = time.perf_counter()
        label = service.metric_label(model_name)
        try:
            body = await _read_body(request, limit)
            _check_json_size(body, request.headers.get(HEADER_LENGTH), service.config.max_json_bytes)
            infer_request = decode_http_request(model_name, model_version, body,
                                                request.headers.get(HEADER_LENGTH),
                                                service.client_shm(lambda: http_peer(request.scope)))
            outputs, version = await service.infer(infer_request)
            content, headers = encode_http_response(infer_request, version, outputs)
        except ProtocolError as exc:
            service.metrics.observe_request(label, "http", exc.status, time.perf_counter() - start)
            raise
        service.metrics.observe_request(label, "http", 200, time.perf_counter() - start)
        return Response(content=content, headers=headers, media_type=headers.pop("Content-Type"))

    async def infer_versioned(model_name: str, model_version: str, request: Request):
        return await infer(model_name, request, model_version)

    responses = {200: {"description": "Inference result", "content": {
        "application/json": {"schema": INFER_RESPONSE},
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}, **INFER_ERRORS}
    app.add_api_route("/v2/models/{model_name}/infer", infer, methods=["POST"], responses=responses,
                      openapi_extra=INFER_OPENAPI, tags=["inference"])
    app.add_api_route("/v2/models/{model_name}/versions/{model_version}/infer", infer_versioned,
                      methods=["POST"], responses=responses, openapi_extra=INFER_OPENAPI, tags=["inference"])

    @app.get("/metrics", tags=["metrics"], responses={200: {"description": "Prometheus text format",
                                                           "content": {"text/plain": {}}}})
    async def metrics():
        # Off the event loop: a GPU read (rocm-smi runs a process) may take a while.
        content, media_type = await asyncio.to_thread(service.metrics.render)
        return Response(content=content, media_type=media_type)

    return app


def server_app(service: InferenceService, budget: InflightBudget):
    """The ASGI application `serve` runs: HttpGuard, then InferRoute, in front of the FastAPI app (which answers
    every other route). In front, not as Starlette middleware: each layer of Starlette's middleware stack
    (ServerErrorMiddleware, ExceptionMiddleware, the user middleware wrappers) costs the event loop time on every
    inference request (~20-30 µs in all, benchmarks/results/issue22_cpu). An exception escaping InferRoute is
    then answered 500 by uvicorn instead of Starlette: the same status, logged the same way."""
    return HttpGuard(InferRoute(create_app(service, guard=False), service), service.config, budget,
                     service.metrics.reject)


async def _read_body(request, limit: int) -> bytes:
    """The body, refused with 413 past ``limit`` bytes (before reading when Content-Length says so),
    inflated when the client compressed it (Content-Encoding gzip/deflate, which tritonclient can send)."""
    declared = request.headers.get("content-length")
    _check_declared(declared, limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProtocolError(413, f"The request body exceeds {limit} bytes (--max-request-mb).")
        chunks.append(chunk)
    return await inflate(b"".join(chunks), request.headers.get("content-encoding", ""), limit)


def _json_body(body: bytes) -> object:
    """A control route's optional JSON body (empty: None); 400 when it does not parse."""
    return parse_json(body) if body.strip() else None


def _check_json_size(body, header_length: str | None, limit: int) -> None:
    """413 for a JSON part over ``limit`` (--max-json-mb): parsed JSON numbers take about ten times their text
    (a 62 MB body of zeros grew the server by 690 MB), binary tensors cost only their bytes."""
    size = len(body)
    if header_length is not None and header_length.strip().isdigit():
        size = min(size, int(header_length))
    if size > limit:
        raise ProtocolError(413, f"The JSON part of the request is {size} bytes; this server parses at most {limit} "
                            "bytes of JSON (--max-json-mb). Send large tensors as binary data (Triton's binary "
                            "tensor extension: tritonclient's binary_data=True).")


def _check_declared(declared: str | None, limit: int) -> None:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProtocolError(413, f"The request body is {int(declared)} bytes; this server accepts at most {limit} "
                            "(--max-request-mb).")


#: Compressed bodies up to this size are inflated on the event loop: deflate expands at most about 1,032-fold,
#: so at most about 1 MB, a millisecond or so; larger ones take a thread.
INFLATE_INLINE_BYTES = 1024


async def inflate(body, encoding: str, limit: int):
    """``body`` inflated per its Content-Encoding (refused past ``limit`` bytes). Large compressed bodies are
    inflated in a thread (zlib releases the GIL): on the event loop, four clients sending gzip at about 440 KB/s
    pushed every other client's p50 from 8 ms to 1.67 s."""
    if encoding.lower() in ("gzip", "deflate") and len(body) > INFLATE_INLINE_BYTES:
        return await asyncio.to_thread(_inflate, body, encoding, limit)
    return _inflate(body, encoding, limit)


def _inflate(body, encoding: str, limit: int):
    encoding = encoding.lower()
    if encoding in ("gzip", "deflate"):
        inflater = zlib.decompressobj(31 if encoding == "gzip" else 15)
        try:
            body = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            raise ProtocolError(400, f"The body is not valid {encoding} data: {exc}.") from None
        if len(body) > limit or inflater.unconsumed_tail:
            raise ProtocolError(413, f"The inflated request body exceeds {limit} bytes (--max-request-mb).")
    elif encoding not in ("", "identity"):
        raise ProtocolError(400, f"Content-Encoding '{encoding}' is not supported; use gzip, deflate or none.")
    return body


_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")


class InferRoute:
    """ASGI middleware answering ``POST /v2/models/{name}[/versions/{version}]/infer`` directly.

    The same protocol functions as the FastAPI route (decode_http_request, InferenceService.infer,
    encode_http_response), the same errors (``{"error": ...}`` with the ProtocolError's status and
    Retry-After) and the same metrics; without the framework's per-request routing, dependency solving and
    Request/Response objects. The body is used as received (one message, e.g. BodyIntake's preallocated body)
    or appended into one buffer.
    """

    def __init__(self, app, service: InferenceService):
        self.app = app
        self.service = service
        self.limit = service.config.max_request_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        match = _INFER_PATH.match(scope["path"])
        if match is None:
            return await self.app(scope, receive, send)
        model_name, model_version = match.group(1), match.group(2) or ""
        service = self.service
        start = time.perf_counter()
        label = service.metric_label(model_name)
        headers = {}
        for key, value in scope["headers"]:
            if key in (b"content-length", b"content-encoding", b"inference-header-content-length"):
                headers[key.decode()] = value.decode("latin-1")
        try:
            with service.expect(model_name) as on_the_way:  # its batch may wait for it while its body arrives
                body = await self._body(receive, headers)
                _check_json_size(body, headers.get(HEADER_LENGTH.lower()), service.config.max_json_bytes)
                request = decode_http_request(model_name, model_version, body, headers.get(HEADER_LENGTH.lower()),
                                              service.client_shm(lambda: http_peer(scope)))
                outputs, version = await service.infer(request, on_the_way)
            content, out_headers = encode_http_response(request, version, outputs)
        except ProtocolError as exc:
            service.metrics.observe_request(label, "http", exc.status, time.perf_counter() - start)
            content = json.dumps({"error": exc.message}).encode()
            extra = [(b"retry-after", str(int(exc.retry_after)).encode())] if exc.retry_after else []
            await _respond(send, exc.status, content, "application/json", extra)
            return
        service.metrics.observe_request(label, "http", 200, time.perf_counter() - start)
        media_type = out_headers.pop("Content-Type")
        await _respond(send, 200, content, media_type,
                       [(k.lower().encode(), v.encode()) for k, v in out_headers.items()])

    async def _body(self, receive, headers: dict) -> bytes | bytearray:
        """The whole body. A body that arrives in one message is used as it is; otherwise the chunks are
        appended to one bytearray, which grows with what has arrived (never with what is only declared)."""
        _check_declared(headers.get("content-length"), self.limit)
        body, size = b"", 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ProtocolError(400, "The client disconnected before sending the whole body.")
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > self.limit:
                    raise ProtocolError(413, f"The request body exceeds {self.limit} bytes (--max-request-mb).")
                if not body:
                    body = chunk
                else:
                    if not isinstance(body, bytearray):
                        body = bytearray(body)
                    body += chunk
            if not message.get("more_body", False):
                break
        return await inflate(body, headers.get("content-encoding", ""), self.limit)


async def _respond(send, status: int, content: bytes, media_type: str, extra: list) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", media_type.encode()), (b"content-length", str(len(content)).encode()), *extra]})
    await send({"type": "http.response.body", "body": content})
