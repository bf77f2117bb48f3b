"""A decoding worker's side of ``serve --workers N --shared-models``: the link to the model process.

The worker parses and validates requests as any server does (its repository holds each model's
:class:`~onnxaccel.serve.signature.ModelSignature`, not its sessions), then hands the tensors to the one model
process (serve/model_host.py), which batches the requests of every worker together and runs them.

Tensors do not travel through the socket: each worker owns an *arena* (serve/arena.py), anonymous shared memory
(``memfd_create``) whose file descriptor it passes to the model process once, at connect (``SCM_RIGHTS``,
``socket.send_fds``). A request's tensors are in the arena already when its body was received there
(http_protocol.py BodyIntake asks :meth:`ModelLink.body_memory` for a slot at header time: no copy at all), or are
copied into a slot of it (one copy, in the worker); the message says where they are; the model process
joins them from there into its page-locked batch buffer, as it would
from a request body. A slot is reused only after the model process answered the request (its batch has
run), so a timed-out request cannot have its bytes overwritten under a running join; a body's slot, once
its request is over too. Small tensors, strings,
and anything that does not fit in the arena at that moment travel inside the message instead (pickled).

Messages are length-prefixed pickles (both ends are this package, in processes of one supervisor, over a
socket in a private folder): ``("infer", id, model, tensors, rows, timeout_s)``, ``("load" | "unload", id,
model)``; answers ``("ok", id, outputs, timing)``, ``("error", id, status, message, retry_after)``, and
``("models", None, described)`` whenever the model process's models change. Numeric arrays inside messages (small
inputs, outputs) travel as ``("raw", dtype, shape, bytearray)`` (:func:`encode_array`), not as pickled arrays.

When the model process exits, waiting requests fail with 503, the models show UNAVAILABLE, and the worker
reconnects to the replacement the supervisor starts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import pickle
import socket
import struct
from collections.abc import Callable

import numpy as np

from onnxaccel.errors import UsageError
from onnxaccel.serve.arena import (
    _CURRENT_BODY, ALIGN, ARENA_BYTES, ArenaBody, _arena, arrival_counts, arrival_slot, tensor_view,
)
from onnxaccel.serve.batcher import BatchTiming
from onnxaccel.serve.protocol import ProtocolError
from onnxaccel.serve.repository import READY, UNAVAILABLE, ModelEntry, ModelIndex

logger = logging.getLogger(__name__)

#: Tensors smaller than this travel inside the message: a pickle copy is cheaper than an arena slot then.
INLINE_BYTES = 16 * 1024

#: Message framing: a 4-byte big-endian length, then the pickle (model_host.py reads it the same way).
FRAME = struct.Struct("!I")
#: A worker's first bytes on a new connection: its arena's size (0: none), sent with the arena's descriptor.
HELLO = struct.Struct("!Q")


def dtype_key(dtype: np.dtype):
    """How a message names a dtype: its string (``'<f4'``, cheap to pickle), or the dtype itself where the string
    loses it (ml_dtypes' bfloat16 and float8 are ``'<V2'``/``'|V1'``, plain bytes, as strings)."""
    return dtype if dtype.kind == "V" else dtype.str


def encode_array(value: np.ndarray):
    """A tensor inside a message: a numeric array as ``("raw", dtype, shape, bytearray)``, which pickles and loads
    much faster than the array itself (no numpy reduce and reconstruct, on every request, in the one model
    process; docs/SERVING.md); an object (string) array stays an array."""
    if value.dtype.hasobject:
        return value
    return "raw", dtype_key(value.dtype), value.shape, bytearray(value.tobytes())  # C order, any strides


def decode_array(encoded) -> np.ndarray:
    """The array :func:`encode_array` described (writable: it owns the bytearray the message brought)."""
    if isinstance(encoded, tuple):
        return np.frombuffer(encoded[3], encoded[1]).reshape(encoded[2])
    return encoded


def encode_arrays(arrays: dict[str, np.ndarray]) -> dict:
    """:func:`encode_array` of each (an answer's outputs)."""
    return {name: encode_array(value) for name, value in arrays.items()}


def decode_arrays(encoded: dict) -> dict[str, np.ndarray]:
    """:func:`decode_array` of each."""
    return {name: decode_array(value) for name, value in encoded.items()}


def pack(message: tuple) -> list[bytes]:
    """A message as the buffers to write (length prefix, pickle)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return [FRAME.pack(len(data)), data]


async def read_message(reader: asyncio.StreamReader) -> tuple:
    """Read one length-prefixed pickled message from the model host link."""
    (size,) = FRAME.unpack(await reader.readexactly(FRAME.size))
    return pickle.loads(await reader.readexactly(size))


class ModelLink:
    """The connection to the model process: send requests, match answers, reconnect after a restart."""

    def __init__(self, path: str, on_models: Callable[[dict], None], on_lost: Callable[[str], None],
                 arena_bytes: int = ARENA_BYTES):
        self.path = path
        self.on_models = on_models
        self.on_lost = on_lost
        self.arena = _arena(arena_bytes)
        #: The arrival counters in the arena's header (serve/arena.py), written here, read by the model process.
        self.arrivals = arrival_counts(self.arena.memory) if self.arena is not None else None
        self.inflight: collections.Counter[str] = collections.Counter()
        self._pending: dict[int, tuple[asyncio.Future, list[int], str]] = {}
        self._ids = itertools.count()
        self._writer: asyncio.StreamWriter | None = None
        self._described = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False

    async def start(self) -> None:
        """Connect, and wait for the model process's first description of its models. Like a reconnection after a
        restart, the first connection waits as long as the model process takes to load: the workers start beside
        it, and the supervisor stops them when it fails (serve/workers.py)."""
        await self._connect(None)
        self._task = asyncio.ensure_future(self._run())
        await self._described.wait()

    async def _connect(self, timeout_s: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        delay = 0.05
        while True:
            try:
                sock = await asyncio.to_thread(self._handshake)
                reader, writer = await asyncio.open_unix_connection(sock=sock)
                break
            except OSError as exc:
                if self._closing:
                    raise ConnectionError("closing") from None
                if deadline is not None and loop.time() > deadline:
                    raise UsageError(f"Cannot reach the model process at {self.path}: {exc}.",
                                     "The supervisor starts it before the workers; see the log above for its "
                                     "error.") from None
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
        self._described.clear()
        self._reader, self._writer = reader, writer

    def _handshake(self) -> socket.socket:
        """Blocking: connect and pass the arena's file descriptor with a hello."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(10)
            sock.connect(self.path)
            hello = HELLO.pack(self.arena.size if self.arena else 0)
            if self.arena is not None:
                socket.send_fds(sock, [hello], [self.arena.fd])
            else:
                sock.sendall(hello)
            sock.setblocking(False)
            return sock
        except BaseException:
            sock.close()
            raise

    async def _run(self) -> None:
        """Read answers until the connection ends; then fail what waits and reconnect."""
        while not self._closing:
            reason = "the model process exited; the server is restarting it"
            try:
                while True:
                    message = await read_message(self._reader)
                    self._dispatch(message)
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                pass
            except Exception as exc:  # noqa: BLE001 - an unreadable answer: start over on a new connection
                reason = f"the link to the model process broke ({type(exc).__name__}: {exc}); reconnecting"
                logger.error("%s", reason)
            self._lost(reason)
            if self._closing:
                return
            try:
                await self._connect(None)
            except ConnectionError:
                return

    def _dispatch(self, message: tuple) -> None:
        kind, rid = message[0], message[1]
        if kind == "models":
            self.on_models(message[2])
            self._described.set()
            return
        waiting = self._pending.pop(rid, None)
        if waiting is None:
            return
        future, slots, model = waiting
        self._free(slots)
        self.inflight[model] -= 1
        if future.done():  # the request timed out or its client left; its slots are free now
            return
        if kind == "ok":
            future.set_result(message[2:])
        else:
            future.set_exception(ProtocolError(message[2], message[3], retry_after=message[4]))

    def _free(self, slots: list) -> None:
        for slot in slots:
            if isinstance(slot, ArenaBody):
                slot.unref()
            else:
                self.arena.free(slot)

    def _lost(self, reason: str) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None
        pending, self._pending = self._pending, {}
        for future, slots, model in pending.values():
            # The model process is gone: its messages' slots are free (bodies still receiving keep theirs).
            self._free(slots)
            self.inflight[model] -= 1
            if not future.done():
                future.set_exception(ProtocolError(503, f"The request was lost: {reason}. Retry it.",
                                                   retry_after=1))
        self.on_lost(reason)

    async def request(self, kind: str, model: str, *args, tensors: dict[str, np.ndarray] | None = None) -> tuple:
        """Send one request; its answer's fields (after kind and id). Raises ProtocolError."""
        if self._writer is None or self._writer.is_closing():
            raise ProtocolError(503, "The model process is restarting; retry shortly.", retry_after=1)
        described, slots = self._place(tensors) if tensors is not None else (None, [])
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[rid] = (future, slots, model)
        self.inflight[model] += 1
        message = (kind, rid, model, described, *args) if tensors is not None else (kind, rid, model, *args)
        try:
            self._writer.writelines(pack(message))
        except (RuntimeError, OSError) as exc:  # uvloop: "unable to perform operation on <UnixTransport closed=True>"
            self._pending.pop(rid, None)  # the model process died before _run saw the connection end
            self._free(slots)
            self.inflight[model] -= 1
            raise ProtocolError(503, "The model process is restarting; retry shortly.", retry_after=1) from exc
        return await future

    def body_memory(self, size: int, header_length: int) -> ArenaBody | None:
        """An arena slot for a request body of ``size`` bytes whose binary tensors start at ``header_length``
        (placed so they start aligned), or None when the arena has no room (the body goes to the heap)."""
        if self.arena is None or self._writer is None:
            return None
        pad = -header_length % ALIGN
        slot = self.arena.alloc(size + pad)
        return None if slot is None else ArenaBody(self.arena, slot, slot + pad, size)

    def _place(self, tensors: dict[str, np.ndarray]) -> tuple[dict, list]:
        """Each tensor by its offset where it is in the arena already (its request's body), else into an arena
        slot (described by offset, dtype, shape) or inline."""
        described, slots = {}, []
        body = _CURRENT_BODY.get()
        for name, value in tensors.items():
            if body is not None and body.arena is self.arena and value.dtype != object:
                offset = body.offset_of(value)
                if offset is not None:
                    body.users += 1
                    slots.append(body)
                    described[name] = ("arena", offset, dtype_key(value.dtype), value.shape)
                    continue
            offset = None
            if self.arena is not None and value.dtype != object and value.nbytes >= INLINE_BYTES:
                offset = self.arena.alloc(value.nbytes)
            if offset is None:
                described[name] = ("inline", encode_array(value))
                continue
            slots.append(offset)
            np.copyto(tensor_view(self.arena.memory, offset, value.dtype, value.shape), value, casting="no")
            described[name] = ("arena", offset, dtype_key(value.dtype), value.shape)
        return described, slots

    async def close(self) -> None:
        """Stop reading from the model host, fail what still waits with a 503, and close the arena."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self._lost("the server is stopping")  # whatever still waits gets its 503 now
        if self.arena is not None:
            self.arena.close()


class RemoteBatcher:
    """A worker's stand-in for a model's DynamicBatcher: the batching happens in the model process. With the
    adaptive queue delay, the requests this worker has taken in and not sent yet (OnTheWay) are counted in its
    arena's header, where the model process's batcher reads them."""

    def __init__(self, link: ModelLink, name: str, adaptive: bool = False):
        self.link = link
        self.name = name
        self._counts = link.arrivals if adaptive else None
        self._slot = arrival_slot(name)

    @property
    def adaptive(self) -> bool:
        """Whether the model process's batcher waits only for requests on their way (else the whole delay)."""
        return self._counts is not None

    @property
    def on_the_way(self) -> int | None:
        """The model's counter of requests on their way (shared with models of the same slot); None: fixed."""
        return None if self._counts is None else int(self._counts[self._slot])

    @on_the_way.setter
    def on_the_way(self, value: int) -> None:
        """Set by OnTheWay (one more, one fewer), in the shared counter the model process reads."""
        self._counts[self._slot] = value

    @property
    def queued(self) -> int:
        """This worker's requests for the model that wait for their answer."""
        return max(0, self.link.inflight[self.name])

    async def submit(self, feeds: dict[str, np.ndarray], rows: int, timeout_s: float | None = None
                     ) -> tuple[dict[str, np.ndarray], BatchTiming]:
        """Send rows to the model host's batcher and wait for their outputs and batch timing."""
        outputs, timing = await self.link.request("infer", self.name, rows, timeout_s, tensors=feeds)
        return decode_arrays(outputs), BatchTiming(*timing)

    def flush(self) -> None:
        """Nothing to do here: the model process flushes its batchers when it drains."""


class RemoteRepository(ModelIndex):
    """A decoding worker's models: their signatures and states as the model process describes them."""

    def __init__(self, path: str, on_state: Callable[[str, bool], None] | None = None,
                 arena_bytes: int = ARENA_BYTES):
        super().__init__()
        self.on_state = on_state
        self.link = ModelLink(path, self._described, self._lost, arena_bytes)

    def _described(self, described: dict) -> None:
        for name, info in described.items():
            entry = self.entries.setdefault(name, ModelEntry(name, info.get("source", "")))
            entry.state, entry.reason = info["state"], info["reason"]
            entry.config, entry.warnings = info["config"], list(info["warnings"])
            entry.instance = info["signature"] if entry.state == READY else None
            adaptive = getattr(entry.config, "queue_delay", "") in ("adaptive", "fill")
            entry.batcher = RemoteBatcher(self.link, name, adaptive) if entry.state == READY else None
            entry.loaded_at = info.get("loaded_at")
            if self.on_state is not None:
                self.on_state(name, entry.state == READY)

    def _lost(self, reason: str) -> None:
        for entry in self.entries.values():
            if entry.state == READY:
                entry.state, entry.reason, entry.batcher = UNAVAILABLE, reason, None
                if self.on_state is not None:
                    self.on_state(entry.name, False)

    async def load_all(self) -> None:
        """Start the link to the model host, which loads the models."""
        await self.link.start()

    async def load(self, name: str) -> ModelEntry:
        """Load (or reload) in the model process; every worker learns the new state from it."""
        await self.link.request("load", name)
        return self.get(name)

    async def unload(self, name: str) -> ModelEntry:
        """Ask the model host to unload a model and return its updated entry."""
        await self.link.request("unload", name)
        return self.get(name)

    def flush(self) -> None:
        """The model process flushes its own batchers when it drains."""

    async def close(self) -> None:
        """Close the link to the model host."""
        await self.link.close()
