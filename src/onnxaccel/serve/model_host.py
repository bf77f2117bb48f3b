"""The model process of ``serve --workers N --shared-models``: one copy of every model, one batcher each,
fed by all the decoding workers (Triton's layout: many request handlers, one scheduler per model).

Why: with ``--workers N`` alone every worker holds its own sessions and batches only the requests that reach
it. With large tensors at high concurrency the workers are needed (one event loop decodes at most ~2,000
ResNet-50 images a second), but N copies of a model split the load into N small batches that the GPU
time-slices between N contexts (docs/BENCHMARKS.md, "Serve"). Here the workers only decode and validate; the
model process owns the GPU, forms full batches from every worker's requests, and answers through a Unix socket
(the wire and the shared-memory arenas: serve/model_link.py). Loading and unloading through the protocol's
repository endpoints work again: there is one copy to change, and every worker is told.

Lifecycle: the supervisor (serve/workers.py) starts this process first and starts the workers once it reported
ready. On SIGTERM it stops taking new connections, runs what is queued without waiting for fuller batches, and
keeps answering until every worker has disconnected (workers drain first) or the drain timeout passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import mmap
import os
import pickle
import signal
import socket
import sys
import time
import weakref

import numpy as np

from onnxaccel import startup
from onnxaccel.engines.pool import pin_for_copies, unpin_for_copies
from onnxaccel.errors import OnnxAccelError
from onnxaccel.serve.arena import arrival_counts, arrival_slot
from onnxaccel.serve.config import ModelConfig, ServerConfig
from onnxaccel.serve.metrics import ServerMetrics
from onnxaccel.serve.model_link import FRAME, HELLO, decode_array, encode_arrays, pack
from onnxaccel.serve.processes import die_with_parent, log_level, name_process
from onnxaccel.serve.protocol import ProtocolError
from onnxaccel.serve.repository import ModelRepository
from onnxaccel.serve.server import _set_gpu_wait, require_a_model
from onnxaccel.target import Target

logger = logging.getLogger(__name__)

#: Seconds a new connection has to send its hello (arena descriptor).
HELLO_TIMEOUT_S = 10.0


class _Worker(asyncio.Protocol):
    """One connected decoding worker: its messages in (framed in ``data_received``, no task per message),
    answers out (those of one loop iteration written together), and its arena mapped here."""

    def __init__(self, host: ModelHost, arena: mmap.mmap | None, flat: np.ndarray | None = None):
        self.host = host
        self.arena = arena
        self._flat = flat  # the arena as bytes (ModelHost._serve makes it, and pins it where it can)
        self.arrivals = arrival_counts(arena) if arena is not None else None  # its requests on their way
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._out: list[bytes] = []

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.host.joined(self)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        while len(buffer) - start >= FRAME.size:
            (size,) = FRAME.unpack_from(buffer, start)
            end = start + FRAME.size + size
            if len(buffer) < end:
                break
            message = pickle.loads(bytes(buffer[start + FRAME.size:end]))
            start = end
            self.host.dispatch(self, message)
        del buffer[:start]

    def connection_lost(self, exc) -> None:
        self.host.left(self)

    def send(self, message: tuple) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.extend(pack(message))

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def tensor(self, described: tuple):
        if described[0] == "inline":
            return decode_array(described[1])
        if self.arena is None:
            raise ProtocolError(500, "A request refers to shared memory this worker never passed.")
        _kind, offset, dtype, shape = described
        dtype = np.dtype(dtype)
        size = dtype.itemsize * math.prod(shape)
        return self._flat[offset:offset + size].view(dtype).reshape(shape)  # cheaper than np.ndarray(buffer=)


class ModelHost:
    """Build it, ``await run(on_ready)``; SIGTERM/SIGINT or ``stop()`` drains it."""

    def __init__(self, source: str, model_defaults: ModelConfig, config: ServerConfig, socket_path: str,
                 multiprocess_dir: str | None):
        self.source, self.model_defaults, self.config = source, model_defaults, config
        self.socket_path = socket_path
        self.multiprocess_dir = multiprocess_dir
        self.workers: set[_Worker] = set()
        self._tasks: set[asyncio.Task] = set()
        self._stop: asyncio.Event | None = None
        self._no_workers: asyncio.Event | None = None
        self._pin_refused = False

    def describe(self) -> dict:
        """Every model's state, config and signature: what a worker needs to validate and route requests."""
        return {name: {"state": e.state, "reason": e.reason, "config": e.config, "warnings": list(e.warnings),
                       "signature": e.instance.signature if e.instance is not None else None,
                       "source": e.source, "loaded_at": e.loaded_at}
                for name, e in self.repository.entries.items()}

    async def run(self, on_ready) -> bool:
        """Load, serve the workers until stopped; True when every worker disconnected in time."""
        self._stop, self._no_workers = asyncio.Event(), asyncio.Event()
        self._no_workers.set()
        self.metrics = metrics = ServerMetrics(multiprocess_dir=self.multiprocess_dir)
        self.repository = ModelRepository(self.source, self.model_defaults, on_batch=metrics.batch_observer,
                                          arrivals=self.arrivals)
        self.repository.require_models()
        _set_gpu_wait(self.repository.defaults.target_value, self.config.gpu_wait)
        await self.repository.load_all()
        require_a_model(self.repository, self.config.allow_unavailable)
        self._release_gil_in_joins()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # a previous model process's socket
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.socket_path)
        listener.listen(256)
        listener.setblocking(False)
        accepting = asyncio.ensure_future(self._accept(listener))
        on_ready(self)
        try:
            await self._stop.wait()
            accepting.cancel()
            listener.close()
            self.repository.flush()
            try:
                await asyncio.wait_for(self._no_workers.wait(), self.config.drain_timeout_s)
                clean = True
            except asyncio.TimeoutError:
                clean = False
        finally:
            accepting.cancel()
            listener.close()
            for worker in list(self.workers):
                worker.close()
            await self.repository.close()
        return clean

    def _release_gil_in_joins(self) -> None:
        """This process's event loop only passes messages, so the pools of the models loaded here join batches
        without holding the GIL: several instances' joins and the loop run at once (engines/pool_io.py
        join_rows). A setting of each pool; a model loaded later gets it in ``_change``."""
        for entry in self.repository.entries.values():
            if entry.instance is not None:
                entry.instance.pool.join_holds_gil = False

    def stop(self) -> None:
        """Begin the drain (SIGTERM does the same)."""
        if self._stop is not None:
            self._stop.set()

    def _spawn(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            connection, _ = await loop.sock_accept(listener)
            self._spawn(self._serve(connection))

    async def _serve(self, connection: socket.socket) -> None:
        try:
            arena = await self._greet(connection)
            flat = np.frombuffer(arena, dtype=np.uint8) if arena is not None else None
            await asyncio.get_running_loop().connect_accepted_socket(lambda: _Worker(self, arena, flat), connection)
            if flat is not None:  # off the ready path: until it is pinned, batches from it are joined on the host
                self._spawn(self._pin(flat))
        except (OSError, EOFError, pickle.UnpicklingError, ValueError, KeyError, AttributeError):
            connection.close()

    async def _pin(self, flat: np.ndarray) -> None:
        """Page-lock a worker's arena with the GPU runtime of the graph-captured models, so that their batches
        are copied from it straight to the GPU (engines/pool.py, the pool's direct copies). Undone when the last
        view of the arena goes (the worker left and its requests' batches finished). Where it fails, batches are
        joined on the host as before; the reason is logged once. Only for models loaded when the worker
        connects."""
        if not self.config.direct_copy:
            return
        graphs = [e.instance for e in list(self.repository.entries.values())
                  if e.instance is not None and e.instance.graph]
        if not graphs:
            return
        target, address = graphs[0].pool.target, flat.ctypes.data
        try:  # in a thread: it waits for a running graph capture (no CUDA call of ours during one)
            reason = await asyncio.to_thread(pin_for_copies, target, address, flat.nbytes)
        except Exception as exc:  # noqa: BLE001 - the host join still works
            reason = f"{type(exc).__name__}: {exc}"
        if reason:
            if not self._pin_refused:
                self._pin_refused = True
                logger.warning("the workers' shared memory could not be page-locked (%s); batches are joined on "
                               "the host", reason)
            return
        # Unpinned from a thread of its own (it waits for a running capture, and takes a while for 128 MiB), not
        # at interpreter exit: the process's end releases everything.
        finalizer = weakref.finalize(flat, _unpin_later, target, address, flat.base)
        finalizer.atexit = False

    def arrivals(self, name: str) -> int:
        """Requests for model ``name`` the workers have taken in and not sent here yet (their arenas' counters;
        another model sharing the counter counts too): the adaptive queue delay waits only while there are any."""
        slot = arrival_slot(name)
        return sum(int(w.arrivals[slot]) for w in self.workers if w.arrivals is not None)

    def joined(self, worker: _Worker) -> None:
        """A worker connected: it gets every model's state and signature."""
        self.workers.add(worker)
        self._no_workers.clear()
        worker.send(("models", None, self.describe()))

    def left(self, worker: _Worker) -> None:
        """The worker exited (or drained and closed); its requests still in batches finish unanswered."""
        self.workers.discard(worker)
        if not self.workers:
            self._no_workers.set()

    def dispatch(self, worker: _Worker, message: tuple) -> None:
        """Route one message of a worker: an inference request, or a load or unload."""
        kind = message[0]
        if kind == "infer":
            self._infer(worker, *message[1:])
        elif kind in ("load", "unload"):
            self._spawn(self._change(worker, kind, *message[1:]))

    def _infer(self, worker: _Worker, rid: int, name: str, described: dict, rows: int,
               timeout_s: float | None) -> None:
        try:
            entry = self.repository.ready(name)
            feeds = {n: worker.tensor(d) for n, d in described.items()}
            future = entry.batcher.enqueue(feeds, rows, timeout_s)
        except ProtocolError as exc:
            worker.send(("error", rid, exc.status, exc.message, exc.retry_after))
            return
        except Exception as exc:  # noqa: BLE001 - answered, so the worker's request does not wait forever
            worker.send(("error", rid, 500, f"Model '{name}': the model process could not queue the request: "
                         f"{type(exc).__name__}: {exc}", None))
            return
        future.add_done_callback(functools.partial(self._answer, worker, rid, name))

    @staticmethod
    def _answer(worker: _Worker, rid: int, name: str, future: asyncio.Future) -> None:
        if future.cancelled():
            worker.send(("error", rid, 503, f"Model '{name}' was unloaded.", 1))
            return
        error = future.exception()
        if error is None:
            outputs, timing = future.result()
            worker.send(("ok", rid, encode_arrays(outputs), (timing.queue_s, timing.compute_s, timing.batch_rows)))
        elif isinstance(error, ProtocolError):
            worker.send(("error", rid, error.status, error.message, error.retry_after))
        else:
            worker.send(("error", rid, 500, f"Inference failed on model '{name}': {type(error).__name__}: {error}",
                         None))

    async def _change(self, worker: _Worker, kind: str, rid: int, name: str) -> None:
        """Load or unload, then tell every worker the new states (before answering the one that asked)."""
        try:
            if self._stop.is_set():
                raise ProtocolError(503, "The server is shutting down.")
            if kind == "load":
                await self.repository.load(name)
                self._release_gil_in_joins()
            else:
                await self.repository.unload(name)
            described = self.describe()
            for other in list(self.workers):
                other.send(("models", None, described))
            answer = ("ok", rid, None, None)
        except ProtocolError as exc:
            answer = ("error", rid, exc.status, exc.message, exc.retry_after)
        except Exception as exc:  # noqa: BLE001 - the repository records load failures; anything else is answered
            answer = ("error", rid, 500, f"Could not {kind} model '{name}': {type(exc).__name__}: {exc}", None)
        worker.send(answer)

    async def _greet(self, connection: socket.socket) -> mmap.mmap | None:
        """The hello: the arena's size (HELLO, fixed length, so no message behind it is read here) and, on
        Linux, its descriptor (SCM_RIGHTS); the arena mapped."""
        connection.setblocking(True)
        connection.settimeout(HELLO_TIMEOUT_S)
        data, fds = await asyncio.to_thread(_receive_hello, connection)
        (arena_bytes,) = HELLO.unpack(data)
        arena = None
        try:
            if fds and arena_bytes:
                arena = mmap.mmap(fds[0], arena_bytes)
        finally:
            for fd in fds:
                os.close(fd)
        connection.setblocking(False)
        return arena


def _unpin_later(target: Target, address: int, mapping) -> None:
    """Unpin an arena whose last view went, off the thread that dropped it (usually the event loop). ``mapping``
    (the arena's mmap) stays referenced until then: memory must be unpinned before it is unmapped."""
    import threading

    def work(mapping=mapping) -> None:
        unpin_for_copies(target, address)  # waits for a running capture
        del mapping  # now it may be unmapped

    threading.Thread(target=work, name="onnxaccel-unpin", daemon=True).start()


def _receive_hello(connection: socket.socket) -> tuple[bytes, list[int]]:
    data, fds = b"", []
    while len(data) < HELLO.size:
        chunk, more, _flags, _address = socket.recv_fds(connection, HELLO.size - len(data), 1)
        if not chunk:
            raise EOFError("the worker closed before its hello")
        data += chunk
        fds += more
    return data, fds


def host_main(source: str, model_defaults: ModelConfig, config: ServerConfig, socket_path: str, multiprocess_dir: str,
              events, supervisor: int) -> None:
    """The model process (spawned by the supervisor). Reports ("models-ready", -1, described) or
    ("error", -1, (message, hint)) on ``events``."""
    startup.record_import()  # the spawned interpreter and its imports (unpickling the arguments), up to here
    die_with_parent(supervisor)
    name_process("onnxaccel-model")
    log_level(config.log_level)
    if config.gil_switch_ms > 0:
        sys.setswitchinterval(config.gil_switch_ms / 1e3)
    host = ModelHost(source, model_defaults, config, socket_path, multiprocess_dir)

    def on_ready(ready: ModelHost) -> None:
        started = startup.summary(ready=True).to_dict()
        ready.metrics.observe_startup("model process", started)
        events.put(("models-ready", -1, {"models": ready.repository.index(), "loaded": time.time(),
                                         "startup": started, "process_start": startup.PROCESS_START}))

    runner = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = getattr(uvloop, "run", runner)
    try:
        clean = runner(host.run(on_ready))
    except OnnxAccelError as exc:
        events.put(("error", -1, (exc.message, exc.hint)))
        raise SystemExit(2) from None
    except Exception as exc:  # noqa: BLE001 - reported to the supervisor, which reports it to the user
        events.put(("error", -1, (f"{type(exc).__name__}: {exc}", None)))
        raise SystemExit(1) from None
    raise SystemExit(0 if clean else 3)
