"""Run the server: HTTP (uvicorn) and gRPC (grpc.aio) on one event loop, models loaded in the background,
and a graceful drain on SIGTERM/SIGINT.

Drain: the service refuses new inference requests (503 / UNAVAILABLE) and reports not ready, the batchers run
what is queued without waiting for fuller batches, in-flight requests finish (up to ``drain_timeout_s``), then
the listeners close and :func:`serve` returns normally, so the process exits 0. uvicorn's own signal handling
re-raises the signal after its shutdown (uvicorn/server.py ``capture_signals``), which would end the process
with -15; it is replaced here.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from onnxaccel import startup
from onnxaccel.engines.pool import set_gpu_wait
from onnxaccel.errors import MissingDependencyError, UsageError
from onnxaccel.serve.arena import arena_bytes
from onnxaccel.serve.auth import uvicorn_tls
from onnxaccel.serve.config import ModelConfig, ServerConfig
from onnxaccel.serve.core import InferenceService
from onnxaccel.serve.grpc_service import create_grpc_server
from onnxaccel.serve.http_app import server_app
from onnxaccel.serve.http_protocol import BodyIntake, http_protocol_class
from onnxaccel.serve.metrics import ServerMetrics
from onnxaccel.serve.model_link import RemoteRepository
from onnxaccel.serve.repository import READY, ModelRepository
from onnxaccel.serve.security import InflightBudget
from onnxaccel.serve.telemetry_bridge import gpu_source
from onnxaccel.target import Target

logger = logging.getLogger(__name__)

SCHEMA = "onnxaccel.serve/1"


@dataclass
class ServeResult:
    """What a finished server reports: its endpoints, models, and how the drain went."""

    http_url: str
    grpc_address: str | None
    models: list[dict]
    drained: bool = True
    warnings: list[str] = field(default_factory=list)
    workers: int = 1
    #: Where the time to ready went, every process's stages (startup.py Startup.to_dict), and when this process
    #: started (time.time(): a supervisor places another process's spans with it).
    startup: dict | None = None
    process_start: float = field(default_factory=lambda: startup.PROCESS_START)

    def to_dict(self) -> dict:
        """JSON-ready form of the result (schema ``SCHEMA``)."""
        return {"schema": SCHEMA, "http_url": self.http_url, "grpc_address": self.grpc_address,
                "models": self.models, "drained": self.drained, "warnings": self.warnings, "workers": self.workers,
                "startup": self.startup, "process_start": self.process_start}


#: What one request body may hold in uvicorn's buffer before it stops reading the socket (its own default is
#: 64 KiB, flow_control.HIGH_WATER_LIMIT).
BODY_HIGH_WATER = 8 * 2**20


def _set_gpu_wait(target: Target, mode: str) -> str:
    """Apply --gpu-wait for the default target's GPU before any model is loaded (the setting is per process
    and device, and takes effect only before the device's context is first used). '' or why not."""
    if mode == "auto":
        return ""
    note = set_gpu_wait(target, mode)  # '' for a CPU target
    if note:
        logger.warning("--gpu-wait %s not applied: %s", mode, note)
    return note


def _raise_body_high_water(max_request_bytes: int) -> None:
    """Let uvicorn buffer a whole tensor body before pausing the socket.

    uvicorn's HTTP protocols (httptools and h11) pause reading whenever a request's unread body passes
    HIGH_WATER_LIMIT (64 KiB) and resume when the app calls receive(): a 600 kB image tensor then costs ten
    pause/resume round trips through the event loop, a large part of the loop's time per request. The limit
    is a module constant with no setting, read at each call, so it is raised here. Memory stays bounded: per
    connection by this value, and in all by --max-request-mb and --max-connections.
    """
    import importlib

    for module in ("uvicorn.protocols.http.httptools_impl", "uvicorn.protocols.http.h11_impl"):
        try:
            impl = importlib.import_module(module)
        except ImportError:  # httptools or h11 not installed
            continue
        if getattr(impl, "HIGH_WATER_LIMIT", None) is not None:
            impl.HIGH_WATER_LIMIT = max(impl.HIGH_WATER_LIMIT, min(BODY_HIGH_WATER, max_request_bytes))


def _uvicorn():
    try:
        import uvicorn
    except ImportError as exc:
        raise MissingDependencyError("uvicorn", "serve", "The HTTP server") from exc
    return uvicorn


def _gpu_source(interval_s: float) -> tuple[Callable[[], list[dict]] | None, Callable[[], None]]:
    """The telemetry sampler's latest GPU readings, when onnxaccel.system.telemetry is present."""
    if interval_s <= 0:
        return None, lambda: None

    return gpu_source(interval_s)


class InferenceServer:
    """One server: build it, ``await run()``; ``request_drain()`` (or SIGTERM) stops it gracefully."""

    def __init__(self, source: str, model_defaults: ModelConfig, config: ServerConfig,
                 on_ready: Callable[[InferenceServer], None] | None = None, *, http_socket=None,
                 multiprocess_dir: str | None = None, peers_ready: Callable[[], bool] | None = None):
        """``http_socket``, ``multiprocess_dir`` and ``peers_ready`` make this one worker of several
        (serve/workers.py): it serves HTTP on the socket its parent bound, shares the gRPC port (SO_REUSEPORT),
        writes metrics to the shared folder, and loads its models before it accepts any connection."""
        self.config = config
        self.http_socket = http_socket
        self.multiprocess_dir = multiprocess_dir
        self.peers_ready = peers_ready
        self.source = source
        self.model_defaults = model_defaults
        self.on_ready = on_ready
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.drained = True
        self._stop: asyncio.Event | None = None

    async def run(self) -> ServeResult:
        """Serve HTTP (and gRPC when configured) until stopped, then drain and return the result."""
        uvicorn = _uvicorn()

        gpu, stop_gpu = _gpu_source(self.config.telemetry_interval_s)
        metrics = ServerMetrics(gpu_source=gpu, multiprocess_dir=self.multiprocess_dir)
        if self.config.model_socket:  # a decoding worker: the models run in the model process

            repository = RemoteRepository(self.config.model_socket,
                                          on_state=lambda name, ready: metrics.model_ready.labels(name).set(
                                              1 if ready else 0),
                                          arena_bytes=arena_bytes(self.config.max_inflight_bytes))
        else:
            repository = ModelRepository(self.source, self.model_defaults, on_batch=metrics.batch_observer,
                                         sees_arrivals=True)
            repository.require_models()
            self.gpu_wait_note = _set_gpu_wait(repository.defaults.target_value, self.config.gpu_wait)
        self.service = service = InferenceService(repository, metrics, self.config)
        if self.peers_ready is not None:
            service.peers_ready = self.peers_ready
        self._stop = asyncio.Event()
        worker = self.http_socket is not None
        if worker:
            # A worker takes connections only once its models are loaded: the parent's socket keeps
            # connections waiting meanwhile, and the other workers answer them.
            await service.load_all()

        _raise_body_high_water(self.config.max_request_bytes)
        # One in-flight budget for the protocol's preallocated bodies and the guard's (security.py BodyIntake);
        # a decoding worker receives bodies straight into its arena, where the model process reads them.
        budget = InflightBudget(self.config.max_inflight_bytes)
        allocate = repository.link.body_memory if isinstance(repository, RemoteRepository) else None
        intake = BodyIntake(self.config, budget, allocate)
        # proxy_headers off: the server reads no client address or scheme (access log off, no redirects), and
        # uvicorn's ProxyHeadersMiddleware would otherwise run on every request.
        http = uvicorn.Config(server_app(service, budget), host=self.config.host, port=self.config.http_port,
                              log_level=self.config.log_level, access_log=False, lifespan="off",
                              limit_concurrency=self.config.max_connections, timeout_graceful_shutdown=5,
                              timeout_keep_alive=self.config.keep_alive_s, proxy_headers=False,
                              http=http_protocol_class(self.config.header_timeout_s, self.config.max_header_bytes,
                                                       intake, service.metrics.reject),
                              h11_max_incomplete_event_size=self.config.max_header_bytes,
                              **uvicorn_tls(self.config))
        http_server = _QuietSignalsServer(http)
        # Bound here, not by uvicorn: uvicorn reports a port in use by logging and sys.exit(3) inside its task
        # (uvicorn/server.py startup), which escapes the event loop as two tracebacks.
        http_socket = self.http_socket if worker else listen_socket(self.config.host, self.config.http_port)
        grpc_server = None
        if self.config.grpc_port is not None:
            try:
                grpc_server, self.grpc_port = self._grpc(service, worker, budget)
            except BaseException:
                if not worker:
                    http_socket.close()
                raise
            await grpc_server.start()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_drain)

        http_task = asyncio.ensure_future(http_server.serve(sockets=[http_socket]))
        while not http_server.started and not http_task.done():
            await asyncio.sleep(0.02)
        if http_task.done():  # could not bind: uvicorn logs and exits
            if grpc_server is not None:
                await grpc_server.stop(0)
            with contextlib.suppress(BaseException):  # uvicorn calls sys.exit(1) when it cannot bind
                http_task.result()
            raise UsageError(f"Cannot listen for HTTP on {self.config.host}:{self.config.http_port}.",
                             "Pick another --http-port (is another server running?).")
        self.http_port = http_server.servers[0].sockets[0].getsockname()[1]
        # A worker of several closes its mappings of regions another worker unregistered (shared_memory.py).
        sweeper = service.shm.sweeper() if service.shm is not None else None
        try:
            if not worker:
                await service.load_all()
            self._require_a_model(repository)
            self.startup = startup.summary(ready=True).to_dict()
            service.metrics.observe_startup("worker" if worker else "server", self.startup)
            if self.on_ready is not None:
                self.on_ready(self)
            await self._stop.wait()
            self.drained = await service.drain(self.config.drain_timeout_s)
        finally:
            http_server.should_exit = True
            if grpc_server is not None:
                await grpc_server.stop(grace=2.0)
            await http_task
            await repository.close()
            stop_gpu()
            if sweeper is not None:
                sweeper.cancel()
            if service.shm is not None:
                service.shm.close()
        return self.result()

    def _grpc(self, service: InferenceService, worker: bool, budget: InflightBudget | None = None):
        """The gRPC server and its port; a port in use is a UsageError naming it (grpc raises a RuntimeError)."""
        address = f"{self.config.host}:{self.config.grpc_port}"
        if not worker and self.config.grpc_port:  # checked first: grpc's C core logs its own bind error to stderr
            listen_socket(self.config.host, self.config.grpc_port, "gRPC", "--grpc-port").close()
        try:
            server, port = create_grpc_server(service, address, reuse_port=worker, budget=budget)
        except RuntimeError as exc:
            if "bind" not in str(exc).lower():
                raise
            port = 0
        if port == 0:  # grpc.aio's add_insecure_port returns 0 (or raises) when it cannot bind
            raise port_in_use("gRPC", self.config.host, self.config.grpc_port, "--grpc-port")
        return server, port

    def _require_a_model(self, repository) -> None:
        """A server (or a worker of several with its own models) whose every model failed to load stops with
        their reasons, unless ``allow_unavailable``: a server answering only 503 looks healthy to a process
        supervisor while serving nothing. With --shared-models the model process checks (model_host.py)."""
        if self.config.model_socket:
            return
        require_a_model(repository, self.config.allow_unavailable)

    def request_drain(self) -> None:
        """Ask the running server to stop accepting work and drain."""
        if self._stop is not None:
            self._stop.set()

    def result(self) -> ServeResult:
        """The serve result: addresses, models and warnings."""
        service = getattr(self, "service", None)
        models = service.repository.index() if service else []
        warnings = [w for e in service.repository.entries.values() for w in e.warnings] if service else []
        grpc = f"{self.config.host}:{self.grpc_port}" if self.grpc_port else None
        return ServeResult(f"http://{self.config.host}:{self.http_port}", grpc, models, self.drained, warnings,
                           startup=getattr(self, "startup", None))


def require_a_model(repository, allow_unavailable: bool) -> None:
    """A UsageError with every model's reason when none loaded, unless ``allow_unavailable``."""
    entries = list(repository.entries.values())
    if allow_unavailable or not entries or any(e.state == READY for e in entries):
        return
    reasons = "; ".join(f"{e.name}: {e.reason}" for e in entries)
    raise UsageError(f"No model could be loaded, so the server stops. {reasons}",
                     "Fix the model(s) above, or pass --allow-unavailable to serve anyway (the models answer 503 "
                     "until loaded through POST /v2/repository/models/NAME/load with --model-control explicit).")


def port_in_use(protocol: str, host: str, port: int, option: str) -> UsageError:
    """The one-line error for a port another process holds: which, and how to choose another."""
    return UsageError(f"The {protocol} port {host}:{port} is in use (another server running?); choose another "
                      f"with {option} PORT, or {option} 0 for any free port.")


def listen_socket(host: str, port: int, protocol: str = "HTTP", option: str = "--http-port") -> socket.socket:
    """A listening TCP socket on host:port, as uvicorn binds it (SO_REUSEADDR, IPv6 for an IPv6 host); a port in
    use is a UsageError naming it."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family = infos[0][0] if infos else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(infos[0][4] if infos else (host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise port_in_use(protocol, host, port, option) from None
        raise UsageError(f"Cannot listen for {protocol} on {host}:{port}: {exc.strerror or exc}.",
                         f"Check --host and {option}.") from None
    sock.set_inheritable(True)
    return sock


def _quiet_server_class():
    uvicorn = _uvicorn()

    class QuietSignalsServer(uvicorn.Server):
        """uvicorn.Server without its signal handlers (the InferenceServer drains first, then stops it)."""

        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return QuietSignalsServer


def _QuietSignalsServer(config):  # noqa: N802 - a class factory used like a class
    return _quiet_server_class()(config)


def run_server(server: InferenceServer) -> ServeResult:
    """Run the server's event loop to completion (uvloop when installed) and return its result."""
    import sys

    if server.config.gil_switch_ms > 0:
        sys.setswitchinterval(server.config.gil_switch_ms / 1e3)
    runner = asyncio.run
    try:
        import uvloop

        return uvloop.run(server.run()) if hasattr(uvloop, "run") else runner(server.run())
    except ImportError:
        return runner(server.run())
