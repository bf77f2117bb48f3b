"""The HTTP protocol level of connection discipline (serve/security.py gives the whole picture): a header read
timeout and size limit on uvicorn's protocol classes, and inference bodies received into memory taken once at
header time (:class:`BodyIntake`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from onnxaccel.serve.auth import PUBLIC_HTTP, token_matches
from onnxaccel.serve.security import _INFER, PREALLOCATED, InflightBudget, route_limit


# --- header timeout (protocol level) --------------------------------------------------------------------

#: The health probes' paths as the HTTP parser gives them.
HEALTH_PATHS = frozenset(p.encode() for p in PUBLIC_HTTP if p.startswith("/v2/health/"))


def header_timeout_protocol(base: type, timeout_s: float, max_bytes: int, intake: BodyIntake | None = None,
                            on_reject: Callable[[str], None] = lambda reason: None) -> type:
    """``base`` (uvicorn's HTTP protocol class) closing a connection whose request line and headers are not all
    in within ``timeout_s``: from the connection (a client that sends nothing) and from the first byte of each
    later request on it; and whose line and headers pass ``max_bytes`` (431). The idle time between requests
    stays uvicorn's keep-alive timeout.

    Works on both uvicorn protocols (httptools and h11): both keep the current request in ``self.cycle``, replaced
    when a request's headers are complete, and mark it ``response_complete`` when answered.

    With ``intake`` and the httptools protocol, inference bodies that declare their length are received into
    memory taken once at header time (BodyIntake), instead of uvicorn's growing buffer and its copy per
    receive(). ``on_reject`` is told each refusal here: header_timeout (408), header_too_large (431) and, on
    httptools, connections (uvicorn's 503 past --max-connections)."""

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
                # The health probes answer past --max-connections: connections held open by slow clients made
                # /v2/health/live answer 503, and a kubelet would restart a server that was holding them off.
                probe = over and self.url.split(b"?", 1)[0] in HEALTH_PATHS
                if over and not probe:
                    on_reject("connections")
                # Not for a pipelined request, nor one uvicorn answers 503 (--max-connections) unread.
                if not over and (cycle is None or cycle.response_complete):
                    body = intake.plan(self.parser.get_method(), self.url, self.headers)
                self._body_next, self._body = body, None
                try:
                    if probe:
                        self.limit_concurrency = None
                    super().on_headers_complete()
                finally:
                    if probe:
                        self.limit_concurrency = limit
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
            super().connection_made(CoalescingTransport(transport, self.loop))  # a response in one write
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            if self._header_timer is None and (cycle is None or cycle.response_complete):
                self._arm_header_timer()  # the first bytes of a new request
            if self._header_timer is not None:
                self._header_bytes += len(data)
                if self._header_bytes > max_bytes and not self._headers_in(data):
                    on_reject("header_too_large")
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
            on_reject("header_timeout")
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


class CoalescingTransport:
    """A connection's transport that sends a response's head and body in one vectored write.

    uvicorn writes a response's status line and headers, then its body, each with its own ``transport.write``:
    two send calls per response, two segments, and on loopback the receiving side's TCP work done twice in this
    process's call. Here a write is held until the next one, and the two leave together (``writelines``: one
    ``writev``, no join copy); a write with no successor is sent by a callback at the end of the event loop's
    turn, and closing sends what is held first. Everything else is the transport's."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport, loop):
        self._transport, self._loop = transport, loop
        self._held = None

    def write(self, data) -> None:
        """Hold ``data`` until the next write (or the end of this turn); with one held, send both at once."""
        if not data:
            return
        held, self._held = self._held, None
        if held is None:  # a response's head: wait for its body (sent at the end of this turn at the latest)
            self._held = data
            self._loop.call_soon(self._flush)
        elif not self._transport.is_closing():
            self._transport.writelines((held, data))

    def writelines(self, chunks) -> None:
        """Each of ``chunks`` as by ``write``."""
        for data in chunks:
            self.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        """Send what is held, then close the connection (after its buffered bytes, as the transport does)."""
        self._flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        """The transport's buffered bytes plus the held write's."""
        return self._transport.get_write_buffer_size() + (len(self._held) if self._held is not None else 0)

    def __getattr__(self, name):
        return getattr(self._transport, name)


def http_protocol_class(timeout_s: float, max_bytes: int, intake: BodyIntake | None = None,
                        on_reject: Callable[[str], None] = lambda reason: None) -> type:
    """uvicorn's automatic HTTP protocol choice (httptools when installed, else h11) with the header limits
    (and, with ``intake``, preallocated inference bodies on httptools)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return header_timeout_protocol(AutoHTTPProtocol, timeout_s, max_bytes, intake, on_reject)


# --- preallocated request bodies (protocol level) ---------------------------------------------------------

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
    at each receive()): three copies and fresh pages for every image tensor, a large share of a worker's CPU per
    request (see docs/BENCHMARKS.md). Here a POST to an
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
