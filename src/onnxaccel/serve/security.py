"""What keeps a reachable server serving: connection discipline (header and body read timeouts, per-route
body limits, one budget for the request bytes all connections hold), bearer-token auth for HTTP and gRPC, TLS
settings (serve/auth.py), and the model-control switch. docs/SECURITY.md describes the threat model and every
limit.

Why each piece is here and not in uvicorn's settings: uvicorn 0.55 has ``timeout_keep_alive`` (idle time
between requests) and ``limit_concurrency`` (connections + tasks before 503), but no timeout for a request whose
line/headers or body never finish, and no limit on a body's size (uvicorn/protocols/http/httptools_impl.py and
h11_impl.py: the keep-alive timer is armed only after a response, the body is buffered as it comes). So:

- headers: ``header_timeout_protocol`` (http_protocol.py) subclasses uvicorn's HTTP protocol and closes a
  connection (408) whose request line and headers are not complete within ``header_timeout_s`` of its first byte
  (or of the connection, for one that sends nothing), as nginx's ``client_header_timeout`` does;
- bodies: ``HttpGuard``, the outermost ASGI middleware, allows ``body_timeout_s`` between two reads of the
  body (nginx's ``client_body_timeout``), refuses a body over its route's limit (413, before reading it when
  Content-Length says so), holds every body against one in-flight budget (503 with Retry-After when a new
  one would pass it), and closes the connection whenever it answers before the body was read to its end.

This module holds the guard, the in-flight budget and each route's body limit, which the protocol's preallocated
bodies (http_protocol.py BodyIntake) share with the guard.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass

from onnxaccel.serve.auth import PUBLIC_HTTP, token_matches
from onnxaccel.serve.protocol import ProtocolError

_INFER = re.compile(r"^/v2/models/[^/]+(?:/versions/[^/]+)?/infer$")

#: The scope extension marking a request whose body BodyIntake preallocated (and holds in the budget).
PREALLOCATED = "onnxaccel.preallocated_body"


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

    def __init__(self, app, config, budget: InflightBudget | None = None,
                 on_reject: Callable[[str], None] = lambda reason: None):
        self.app = app
        self.config = config
        #: Told the reason of each refusal (ServerMetrics.reject: onnxaccel_rejected_requests_total).
        self.on_reject = on_reject
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
            self.on_reject("auth")
            return await _refuse(send, 401, "This server needs a token: send 'Authorization: Bearer <token>'.",
                                 [(b"www-authenticate", b"Bearer")], close=size > 0 or chunked)
        limit, option = self.route_limit(scope, headers)
        if size > limit:
            self.on_reject("body_too_large")
            return await _refuse(send, 413, f"The request body is {size} bytes; this server accepts at most "
                                 f"{limit} here ({option}).", close=True)
        # Small bodies pass outside the budget (at most --max-connections x 64 KiB in all), so clients holding it
        # with large stalled bodies cannot stop the small requests, health probes and control calls. A body the
        # protocol preallocated (BodyIntake) holds its bytes already, until its request ends.
        held = size if size > self.config.max_control_bytes and PREALLOCATED not in scope.get("extensions", ()) \
            else 0
        if not self.budget.take(held):
            self.on_reject("inflight_budget")
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
        timeout, budget, reject = self.config.body_timeout_s, self.budget, self.on_reject
        deadline_s = self.config.body_deadline_s
        seen, ends = 0, None

        async def guarded():
            nonlocal seen, ends
            if state.done:
                return await receive()
            loop = asyncio.get_running_loop()
            ends = loop.time() + deadline_s if ends is None else ends
            left = ends - loop.time()
            try:
                async with asyncio.timeout(max(0.0, min(timeout, left))):
                    message = await receive()
            except TimeoutError:
                reject("body_timeout")
                if left <= timeout:
                    raise ProtocolError(408, f"The request body took more than {deadline_s:g} s in all "
                                        "(--body-deadline).") from None
                raise ProtocolError(408, f"The request body stalled: nothing arrived for {timeout:g} s "
                                    "(--body-timeout).") from None
            if message["type"] == "http.request":
                chunk = len(message.get("body", b""))
                seen += chunk
                if seen > state.limit:
                    reject("body_too_large")
                    raise ProtocolError(413, f"The request body exceeds {state.limit} bytes ({option}).")
                if not declared:  # chunked: hold the bytes as they come
                    if not budget.take(chunk):
                        reject("inflight_budget")
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
