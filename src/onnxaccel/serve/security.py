"""What keeps a reachable server serving: connection discipline (header and body read timeouts, per-route
body limits, one budget for the request bytes all connections hold), bearer-token auth for HTTP and gRPC, TLS
settings, and the model-control switch. docs/SECURITY.md describes the threat model and every limit.

Why each piece is here and not in uvicorn's settings: uvicorn 0.55 has ``timeout_keep_alive`` (idle time
between requests) and ``limit_concurrency`` (connections + tasks before 503), but no timeout for a request whose
line/headers or body never finish, and no limit on a body's size (uvicorn/protocols/http/httptools_impl.py and
h11_impl.py: the keep-alive timer is armed only after a response, the body is buffered as it comes). So:

- headers: ``header_timeout_protocol`` subclasses uvicorn's HTTP protocol and closes a connection (408) whose
  request line and headers are not complete within ``header_timeout_s`` of its first byte (or of the connection,
  for one that sends nothing), as nginx's ``client_header_timeout`` does;
- bodies: ``HttpGuard``, the outermost ASGI middleware, allows ``body_timeout_s`` between two reads of the
  body (nginx's ``client_body_timeout``), refuses a body over its route's limit (413, before reading it when
  Content-Length says so), holds every body against one in-flight budget (503 with Retry-After when a new
  one would pass it), and closes the connection whenever it answers before the body was read to its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import re
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

from onnxaccel.errors import UsageError
from onnxaccel.serve.protocol import ProtocolError

#: The environment variable holding the bearer token (``--auth-token-file`` takes precedence).
TOKEN_ENV = "ONNXACCEL_AUTH_TOKEN"

#: Routes answered without a token: the health probes (a load balancer or kubelet has none).
PUBLIC_HTTP = frozenset({"/v2/health/live", "/v2/health/ready"})
#: gRPC methods answered without a token (the same probes).
PUBLIC_GRPC = frozenset({"ServerLive", "ServerReady"})

_INFER = re.compile(r"^/v2/models/[^/]+(?:/versions/[^/]+)?/infer$")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def read_token(path: str | None) -> str | None:
    """The bearer token from ``path`` (``--auth-token-file``, surrounding whitespace stripped) or from the
    ONNXACCEL_AUTH_TOKEN environment variable; None when neither is set. An empty or unreadable file is a
    UsageError: a server meant to be protected must not start open."""
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise UsageError(f"Cannot read --auth-token-file {path}: {exc.strerror or exc}.",
                             "Give a readable file holding the token (e.g. `openssl rand -hex 32 > token`).") from None
        if not token:
            raise UsageError(f"--auth-token-file {path} is empty.", "Write the token into it, e.g. "
                             "`openssl rand -hex 32 > token`.")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


def token_matches(header: str | bytes | None, token: str) -> bool:
    """Whether an ``Authorization`` value is ``Bearer <token>``, compared in constant time."""
    if header is None:
        return False
    if isinstance(header, str):
        header = header.encode("latin-1", "replace")
    scheme, _, given = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token.encode())


def check_tls_files(cert: str | None, key: str | None, client_ca: str | None) -> None:
    """--tls-cert and --tls-key come together, --tls-client-ca only with them, and every file loads; a
    UsageError naming the file otherwise (before any port is bound)."""
    if bool(cert) != bool(key):
        raise UsageError("--tls-cert and --tls-key go together.", "Give both (PEM certificate chain and its key).")
    if client_ca and not cert:
        raise UsageError("--tls-client-ca verifies client certificates, which needs TLS.",
                         "Add --tls-cert and --tls-key.")
    if not cert:
        return
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        if client_ca:
            context.load_verify_locations(client_ca)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"Cannot load the TLS files (--tls-cert {cert}, --tls-key {key}"
                         + (f", --tls-client-ca {client_ca}" if client_ca else "") + f"): {exc}.",
                         "Give PEM files: the certificate chain, its unencrypted private key, and the CA that "
                         "signs client certificates.") from None


def uvicorn_tls(config) -> dict:
    """uvicorn.Config keyword arguments for the server's TLS settings (none without --tls-cert)."""
    if not config.tls_cert:
        return {}
    options = {"ssl_certfile": config.tls_cert, "ssl_keyfile": config.tls_key}
    if config.tls_client_ca:
        options.update(ssl_ca_certs=config.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


def grpc_credentials(config):
    """grpc server credentials for the TLS settings, or None for an insecure port."""
    if not config.tls_cert:
        return None
    import grpc

    key, cert = Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes()
    ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def grpc_auth_interceptor(token: str):
    """A grpc.aio interceptor answering UNAUTHENTICATED to every call without ``authorization: Bearer <token>``
    metadata, except the health probes."""
    import grpc

    async def deny(_request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                            "This server needs a token: send the metadata 'authorization: Bearer <token>'.")

    denied = grpc.unary_unary_rpc_method_handler(deny, request_deserializer=lambda b: b)

    class AuthInterceptor(grpc.aio.ServerInterceptor):
        async def intercept_service(self, continuation, details):
            if details.method.rsplit("/", 1)[-1] in PUBLIC_GRPC:
                return await continuation(details)
            for key, value in details.invocation_metadata or ():
                if key == "authorization" and token_matches(value, token):
                    return await continuation(details)
            return denied

    return AuthInterceptor()


# --- header timeout (protocol level) --------------------------------------------------------------------

def header_timeout_protocol(base: type, timeout_s: float, max_bytes: int, intake: BodyIntake | None = None) -> type:
    """``base`` (uvicorn's HTTP protocol class) closing a connection whose request line and headers are not all
    in within ``timeout_s``: from the connection (a client that sends nothing) and from the first byte of each
    later request on it; and whose line and headers pass ``max_bytes`` (431). The idle time between requests
    stays uvicorn's keep-alive timeout.

    Works on both uvicorn protocols (httptools and h11): both keep the current request in ``self.cycle``, replaced
    when a request's headers are complete, and mark it ``response_complete`` when answered.

    With ``intake`` and the httptools protocol, inference bodies that declare their length are received into
    memory taken once at header time (BodyIntake), instead of uvicorn's growing buffer and its copy per
    receive()."""

    httptools = intake is not None and hasattr(base, "on_body") and hasattr(base, "_start_asgi_task")

    class HeaderTimeoutProtocol(base):
        _header_timer = None
        _header_bytes = 0
        _body_next = None  # the body planned for the request whose headers are being completed
        _body = None  # the current request's preallocated body

        if httptools:
            def on_headers_complete(self) -> None:
                cycle = self.cycle
                body = None
                limit = self.limit_concurrency
                over = limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit)
                # Not for a pipelined request, nor one uvicorn answers 503 (--max-connections) unread.
                if not over and (cycle is None or cycle.response_complete):
                    body = intake.plan(self.parser.get_method(), self.url, self.headers)
                self._body_next, self._body = body, None
                try:
                    super().on_headers_complete()
                finally:
                    if self._body_next is not None:  # not started (an upgrade): give the memory back
                        self._body_next.release()
                        self._body_next = None

            def _start_asgi_task(self, cycle, app) -> None:
                body, self._body_next = self._body_next, None
                if body is not None:
                    self._body = body
                    app = body.attach(cycle, app, self.loop)
                super()._start_asgi_task(cycle, app)

            def on_body(self, data: bytes) -> None:
                body = self._body
                if body is None or body.cycle is not self.cycle:
                    return super().on_body(data)
                if not self.cycle.response_complete:
                    body.write(data)

            def on_message_complete(self) -> None:
                body = self._body
                if body is not None and body.cycle is self.cycle:
                    body.finish()
                super().on_message_complete()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            if self._header_timer is None and (cycle is None or cycle.response_complete):
                self._arm_header_timer()  # the first bytes of a new request
            if self._header_timer is not None:
                self._header_bytes += len(data)
                if self._header_bytes > max_bytes and not self._headers_in(data):
                    self._close_with(431, "Request Header Fields Too Large",
                                     f"The request line and headers pass {max_bytes} bytes.")
                    return
            super().data_received(data)
            if self.cycle is not cycle:  # its headers are complete: the body has its own timeout
                self._disarm_header_timer()

        def _headers_in(self, data: bytes) -> bool:
            """Whether the headers end within the first max_bytes (a large body may follow in one read)."""
            end = data.find(b"\r\n\r\n")
            return end >= 0 and self._header_bytes - len(data) + end <= max_bytes

        def connection_lost(self, exc) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            self._header_bytes = 0
            self._header_timer = self.loop.call_later(timeout_s, self._header_timeout)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            self._close_with(408, "Request Timeout", "The request line and headers did not arrive in time.")

        def _close_with(self, status: int, reason: str, text: str) -> None:
            self._disarm_header_timer()
            if self.transport.is_closing():
                return
            body = text.encode()
            self.transport.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\nconnection: close\r\n"
                                 f"content-length: {len(body)}\r\n\r\n".encode() + body)
            self.transport.close()

    HeaderTimeoutProtocol.__name__ = f"HeaderTimeout{base.__name__}"
    return HeaderTimeoutProtocol


def http_protocol_class(timeout_s: float, max_bytes: int, intake: BodyIntake | None = None) -> type:
    """uvicorn's automatic HTTP protocol choice (httptools when installed, else h11) with the header limits
    (and, with ``intake``, preallocated inference bodies on httptools)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return header_timeout_protocol(AutoHTTPProtocol, timeout_s, max_bytes, intake)


# --- preallocated request bodies (protocol level) ---------------------------------------------------------

#: The scope extension marking a request whose body BodyIntake preallocated (and holds in the budget).
PREALLOCATED = "onnxaccel.preallocated_body"
#: Seconds between two progress messages of a preallocated body while it arrives (at most a quarter of
#: --body-timeout): HttpGuard's --body-timeout counts from the last message the app received, so a slow but
#: steady body must show progress.
BODY_PROGRESS_S = 0.5
#: Seconds a body may take to arrive in shared memory (an arena slot) before it moves to the heap.
ARENA_HOLD_S = 0.5


class HeapBody:
    """Body memory from the heap: one bytearray of the declared size. (The interface ``allocate`` answers with:
    ``view`` to write into, ``handed()`` for the app, ``bind()`` around the app's call, ``close()`` once.)"""

    __slots__ = ("view",)

    def __init__(self, size: int):
        self.view = bytearray(size)

    def handed(self):
        """What the app receives as the body."""
        return self.view

    def bind(self):
        """A context around the request's handling (the arena's marks its body as the current one)."""
        return contextlib.nullcontext()

    #: Not shared memory: it may stay for as long as the body takes to arrive.
    shared = False

    def close(self) -> None:
        """The request is over: the buffer goes with the app's last reference to it."""
        self.view = None


class BodyIntake:
    """Receives inference request bodies into memory taken once, when their headers are complete.

    uvicorn's httptools protocol appends each piece of a body to a bytearray (which grows, and is copied again
    at each receive()): three copies and fresh pages for every 600 kB image tensor, ~40 % of a worker's CPU per
    request (benchmarks/results/issue22_cpu/serve_http_worker_profile_2026-12-04.md). Here a POST to an
    inference route whose Content-Length is declared, over the small-body size, within its route's limit and
    the in-flight budget (and with the token, when one is set) gets its whole size at header time: from
    ``allocate`` (a decoding worker's shared-memory arena, so the model process reads the tensors where they
    landed) or else the heap. The app receives one message with the whole body; while it arrives slowly, empty
    progress messages every BODY_PROGRESS_S keep --body-timeout meaning "nothing arrived for N s". Every
    other request (chunked, pipelined, over a limit, refused) goes through uvicorn and HttpGuard unchanged.

    The bytes are held in ``budget`` (shared with HttpGuard, which then does not count them again) until the
    request's ASGI task ends; the memory is freed then too, or later by its last user (the arena counts).
    """

    def __init__(self, config, budget: InflightBudget, allocate=None):
        self.config = config
        self.budget = budget
        #: ``allocate(size, header_length)`` -> body memory with HeapBody's interface (``view``, ``handed()``,
        #: ``bind()``, ``close()``, ``shared``), or None when it has no room: then the heap.
        self.allocate = allocate

    def plan(self, method: bytes, url: bytes, headers: list) -> _Body | None:
        """The body for a request whose headers are complete, or None to leave it to uvicorn."""
        if method != b"POST":
            return None
        raw = url.split(b"?", 1)[0]
        path = raw.decode("latin-1")
        if b"%" in raw or not _INFER.match(path):
            return None
        found = dict(headers)
        declared = found.get(b"content-length")
        if declared is None or not declared.isdigit() or b"transfer-encoding" in found:
            return None
        size = int(declared)
        limit, _ = route_limit(self.config, "POST", path, found)
        if size <= self.config.max_control_bytes or size > limit:
            return None
        token = self.config.auth_token
        if token and not token_matches(found.get(b"authorization"), token):
            return None
        if not self.budget.take(size):
            return None
        try:
            memory = None
            if self.allocate is not None:
                header = found.get(b"inference-header-content-length", b"")
                memory = self.allocate(size, int(header) if header.isdigit() else 0)
            if memory is None:
                memory = HeapBody(size)
        except BaseException:
            self.budget.give(size)
            raise
        return _Body(memory, size, self.budget, min(BODY_PROGRESS_S, self.config.body_timeout_s / 4))


class _Body:
    """One preallocated body: filled by the protocol, handed to the app once, released when its task ends.

    A body still arriving ARENA_HOLD_S after its headers moves from shared memory to the heap: the arena is a ring
    whose space comes back oldest first, so a slow (or trickling) client would otherwise block every later slot."""

    __slots__ = ("memory", "view", "size", "pos", "complete", "handed", "cycle", "budget", "last_signal", "every",
                 "loop", "signal_timer", "move_timer")

    def __init__(self, memory, size: int, budget: InflightBudget, every: float = BODY_PROGRESS_S):
        self.memory, self.size, self.budget, self.every = memory, size, budget, every
        self.view = memoryview(memory.view)
        self.pos, self.complete, self.handed, self.cycle = 0, False, False, None
        self.last_signal = 0.0
        self.loop = self.signal_timer = self.move_timer = None

    def attach(self, cycle, app, loop):
        """Take over ``cycle``'s receive and wrap ``app`` so the memory is released when the request ends."""
        self.cycle, self.loop = cycle, loop
        cycle.scope.setdefault("extensions", {})[PREALLOCATED] = self.size
        cycle.receive = self.receive  # read by run_asgi when the task starts
        self.last_signal = time.monotonic()
        if getattr(self.memory, "shared", False):
            self.move_timer = loop.call_later(ARENA_HOLD_S, self._leave_shared_memory)

        async def releasing(scope, receive, send):
            try:
                with self.memory.bind():
                    await app(scope, receive, send)
            finally:
                self.release()

        return releasing

    def write(self, data: bytes) -> None:
        if self.budget is None:  # released: the request is over
            return
        end = min(self.pos + len(data), self.size)
        self.view[self.pos:end] = data[:end - self.pos]
        self.pos = end
        wait = self.every - (time.monotonic() - self.last_signal)
        if wait <= 0:
            self._signal()
        elif self.signal_timer is None:  # shown late, never lost: the body timeout runs from the last message
            self.signal_timer = self.loop.call_later(wait, self._signal)

    def finish(self) -> None:
        """The whole body is in."""
        self.complete = True
        self._cancel_timers()

    def _signal(self) -> None:
        self.signal_timer = None
        if self.budget is not None and not self.complete:
            self.last_signal = time.monotonic()
            self.cycle.message_event.set()

    def _leave_shared_memory(self) -> None:
        self.move_timer = None
        if self.budget is None or self.complete:
            return
        heap = HeapBody(self.size)
        heap.view[:self.pos] = self.view[:self.pos]
        self.view.release()
        shared, self.memory, self.view = self.memory, heap, memoryview(heap.view)
        shared.close()

    def _cancel_timers(self) -> None:
        for timer in (self.signal_timer, self.move_timer):
            if timer is not None:
                timer.cancel()
        self.signal_timer = self.move_timer = None

    async def receive(self):
        cycle = self.cycle
        if self.handed:  # after the body: uvicorn's receive (waits for a disconnect)
            return await type(cycle).receive(cycle)
        if cycle.waiting_for_100_continue and not cycle.transport.is_closing():
            cycle.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        if not self.complete and not cycle.disconnected and not cycle.response_complete:
            await cycle.message_event.wait()
        cycle.message_event.clear()
        if cycle.disconnected or cycle.response_complete:
            return {"type": "http.disconnect"}
        if not self.complete:
            return {"type": "http.request", "body": b"", "more_body": True}
        self.handed = True
        self.view.release()
        return {"type": "http.request", "body": self.memory.handed(), "more_body": False}

    def release(self) -> None:
        """The request is over (or never started): its bytes back to the budget, its memory closed and dropped
        (the protocol and the cycle keep this object until the connection's next request)."""
        if self.budget is None:
            return
        self._cancel_timers()
        self.budget.give(self.size)
        self.budget = None
        self.view.release()
        self.memory.close()
        self.memory = self.cycle = None


# --- the ASGI guard --------------------------------------------------------------------------------------

@dataclass
class InflightBudget:
    """Request-body bytes every connection together may hold at once (``--max-inflight-mb``)."""

    limit: int
    used: int = 0

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes; False (nothing held) when that would pass the limit."""
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        """Release bytes held by a finished request."""
        self.used = max(0, self.used - size)


def route_limit(config, method: str, path: str, headers: dict) -> tuple[int, str]:
    """The body limit of a request's route and the option that sets it (``headers``: lower-case bytes keys)."""
    if method == "POST" and _INFER.match(path):
        json_only = b"inference-header-content-length" not in headers and b"content-encoding" not in headers
        if json_only and config.max_json_bytes < config.max_request_bytes:
            return config.max_json_bytes, "--max-json-mb: send large tensors as binary data"
        return config.max_request_bytes, "--max-request-mb"
    return config.max_control_bytes, "the control-route limit (64 KiB)"


class _BodyState:
    __slots__ = ("done", "held", "limit")

    def __init__(self, done: bool, limit: int):
        self.done, self.held, self.limit = done, 0, limit


class HttpGuard:
    """The outermost ASGI middleware: token check, per-route body limit, the in-flight budget, the body read
    timeout, and ``connection: close`` on any answer given before the request's body was read to its end (so
    its unread rest is never parsed as a next request, and a refused client cannot go on sending)."""

    def __init__(self, app, config, budget: InflightBudget | None = None):
        self.app = app
        self.config = config
        self.token = config.auth_token
        #: Shared with the server's BodyIntake, which takes a preallocated body's bytes before the guard runs.
        self.budget = budget if budget is not None else InflightBudget(config.max_inflight_bytes)

    def route_limit(self, scope, headers: dict) -> tuple[int, str]:
        """The body limit of this request's route and the option that sets it."""
        return route_limit(self.config, scope["method"], scope["path"], headers)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        size = int(declared) if declared is not None and declared.isdigit() else 0
        if self.token and not self._public(scope["path"]) and not token_matches(headers.get(b"authorization"),
                                                                                 self.token):
            return await _refuse(send, 401, "This server needs a token: send 'Authorization: Bearer <token>'.",
                                 [(b"www-authenticate", b"Bearer")], close=size > 0 or chunked)
        limit, option = self.route_limit(scope, headers)
        if size > limit:
            return await _refuse(send, 413, f"The request body is {size} bytes; this server accepts at most "
                                 f"{limit} here ({option}).", close=True)
        # Small bodies pass outside the budget (at most --max-connections x 64 KiB in all), so clients holding it
        # with large stalled bodies cannot stop the small requests, health probes and control calls. A body the
        # protocol preallocated (BodyIntake) holds its bytes already, until its request ends.
        held = size if size > self.config.max_control_bytes and PREALLOCATED not in scope.get("extensions", ()) \
            else 0
        if not self.budget.take(held):
            return await _refuse(send, 503, "The server holds as many request bytes as it may (--max-inflight-mb); "
                                 "retry shortly.", [(b"retry-after", b"1")], close=True)
        state = _BodyState(done=size == 0 and not chunked, limit=limit)
        state.held = held
        try:
            await self.app(scope, self._receive(receive, state, bool(declared), option), self._send(send, state))
        finally:
            self.budget.give(state.held)

    def _public(self, path: str) -> bool:
        return path in PUBLIC_HTTP or (path == "/metrics" and not self.config.auth_metrics)

    def _receive(self, receive, state: _BodyState, declared: bool, option: str):
        timeout, budget = self.config.body_timeout_s, self.budget
        seen = 0

        async def guarded():
            nonlocal seen
            if state.done:
                return await receive()
            try:
                async with asyncio.timeout(timeout):
                    message = await receive()
            except TimeoutError:
                raise ProtocolError(408, f"The request body stalled: nothing arrived for {timeout:g} s "
                                    "(--body-timeout).") from None
            if message["type"] == "http.request":
                chunk = len(message.get("body", b""))
                seen += chunk
                if seen > state.limit:
                    raise ProtocolError(413, f"The request body exceeds {state.limit} bytes ({option}).")
                if not declared:  # chunked: hold the bytes as they come
                    if not budget.take(chunk):
                        raise ProtocolError(503, "The server holds as many request bytes as it may "
                                            "(--max-inflight-mb); retry shortly.", retry_after=1)
                    state.held += chunk
                state.done = not message.get("more_body", False)
            else:
                state.done = True
            return message

        return guarded

    @staticmethod
    def _send(send, state: _BodyState):
        async def guarded(message):
            if message["type"] == "http.response.start" and not state.done:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        return guarded


async def _refuse(send, status: int, text: str, extra: list | None = None, *, close: bool) -> None:
    import json

    content = json.dumps({"error": text}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
               *(extra or [])]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
