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
import hmac
import os
import re
import ssl
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

def header_timeout_protocol(base: type, timeout_s: float, max_bytes: int) -> type:
    """``base`` (uvicorn's HTTP protocol class) closing a connection whose request line and headers are not all
    in within ``timeout_s``: from the connection (a client that sends nothing) and from the first byte of each
    later request on it; and whose line and headers pass ``max_bytes`` (431). The idle time between requests
    stays uvicorn's keep-alive timeout.

    Works on both uvicorn protocols (httptools and h11): both keep the current request in ``self.cycle``, replaced
    when a request's headers are complete, and mark it ``response_complete`` when answered."""

    class HeaderTimeoutProtocol(base):
        _header_timer = None
        _header_bytes = 0

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


def http_protocol_class(timeout_s: float, max_bytes: int) -> type:
    """uvicorn's automatic HTTP protocol choice (httptools when installed, else h11) with the header limits."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return header_timeout_protocol(AutoHTTPProtocol, timeout_s, max_bytes)


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


class _BodyState:
    __slots__ = ("done", "held", "limit")

    def __init__(self, done: bool, limit: int):
        self.done, self.held, self.limit = done, 0, limit


class HttpGuard:
    """The outermost ASGI middleware: token check, per-route body limit, the in-flight budget, the body read
    timeout, and ``connection: close`` on any answer given before the request's body was read to its end (so
    its unread rest is never parsed as a next request, and a refused client cannot go on sending)."""

    def __init__(self, app, config):
        self.app = app
        self.config = config
        self.token = config.auth_token
        self.budget = InflightBudget(config.max_inflight_bytes)

    def route_limit(self, scope, headers: dict) -> tuple[int, str]:
        """The body limit of this request's route and the option that sets it."""
        if scope["method"] == "POST" and _INFER.match(scope["path"]):
            json_only = b"inference-header-content-length" not in headers and b"content-encoding" not in headers
            if json_only and self.config.max_json_bytes < self.config.max_request_bytes:
                return self.config.max_json_bytes, "--max-json-mb: send large tensors as binary data"
            return self.config.max_request_bytes, "--max-request-mb"
        return self.config.max_control_bytes, "the control-route limit (64 KiB)"

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
        # with large stalled bodies cannot stop the small requests, health probes and control calls.
        held = size if size > self.config.max_control_bytes else 0
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
