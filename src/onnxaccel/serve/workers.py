"""`serve --workers N`: N server processes behind the same ports, as uvicorn's and gunicorn's workers are.

Why: one Python process decodes every request on one event loop. With large binary tensors at high
concurrency (ResNet-50 images, 600 kB each, thousands per second) that loop, not the GPU, sets the pace. N
processes decode in parallel; each holds its own copy of every model (N x the model's GPU memory) and batches
the requests that reach it.

How:
* The supervisor binds the HTTP socket once and hands it to every worker (spawned processes: a fork after
  CUDA or ROCm initialised is unsafe); the kernel gives each connection to one of them. gRPC is bound by every
  worker on the same port with SO_REUSEPORT (the supervisor reserves the port first when asked for port 0).
* A worker loads its models before it accepts connections, and reports ready only once every worker has
  (a shared event), so a readiness probe never sees a half-loaded server.
* Metrics go to prometheus_client's multiprocess files in a private folder; a scrape (any worker) and Triton's
  statistics add up all workers. System shared memory registrations live in another private folder that every
  worker reads (serve/shared_memory.py), so a region registered through one worker is used through any.
  Repository load/unload through the API is refused (each worker would change only its own copy).
* SIGTERM/SIGINT to the supervisor: every worker drains (serve/server.py) and exits; the supervisor waits for
  them, then removes the metrics folder. A worker that dies while serving is replaced (its metrics marked
  dead), as gunicorn does, so capacity comes back.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue as queue_module
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import wait

from onnxaccel import startup
from onnxaccel.errors import OnnxAccelError, UsageError
from onnxaccel.serve.config import ModelConfig, ServerConfig
from onnxaccel.serve.model_host import host_main
from onnxaccel.serve.processes import die_with_parent, log_level, name_process, owned_tempdir, reap_stale_dirs
from onnxaccel.serve.server import InferenceServer, ServeResult, run_server

#: Seconds the supervisor waits for a worker beyond the drain timeout before killing it.
EXIT_GRACE_S = 15.0
#: More worker exits than this within the window stop the server instead of restarting again.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


def _bind(host: str, port: int, *, what: str, hint: str, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT if reuse_port else socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"Cannot listen for {what} on {host}:{port}: {exc.strerror}.", hint) from None
    return sock


def _bind_http(host: str, port: int) -> socket.socket:
    """The listening socket every worker accepts from."""
    sock = _bind(host, port, what="HTTP", hint="Pick another --http-port (is another server running?).")
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _reserve_grpc(host: str, port: int) -> tuple[socket.socket, int]:
    """A bound, not listening, SO_REUSEPORT socket: it keeps the port for the workers without taking
    connections itself. A plain bind first, so a port another server already shares out (gRPC servers set
    SO_REUSEPORT by default) is an error instead of two servers answering on one port."""
    hint = "Pick another --grpc-port, or --no-grpc."
    probe = _bind(host, port, what="gRPC", hint=hint)
    port = probe.getsockname()[1]
    probe.close()
    sock = _bind(host, port, what="gRPC", hint=hint, reuse_port=True)
    return sock, port


def _worker_main(index: int, source: str, model_defaults: ModelConfig, config: ServerConfig, http_socket: socket.socket,
                 metrics_dir: str, events, all_ready, supervisor: int) -> None:
    """One worker process: a whole server on the shared sockets. Reports ("ready", index, result) or
    ("error", index, message) on ``events``."""
    startup.record_import()  # the spawned interpreter and its imports (unpickling the arguments), up to here
    die_with_parent(supervisor)
    name_process(f"onnxaccel-w{index}")
    log_level(config.log_level)

    def on_ready(server: InferenceServer) -> None:
        events.put(("ready", index, server.result().to_dict()))

    server = InferenceServer(source, model_defaults, config, on_ready, http_socket=http_socket,
                             multiprocess_dir=metrics_dir, peers_ready=_latch(all_ready))
    try:
        result = run_server(server)
    except OnnxAccelError as exc:
        events.put(("error", index, (exc.message, exc.hint)))
        raise SystemExit(2) from None
    except Exception as exc:  # noqa: BLE001 - reported to the supervisor, which reports it to the user
        events.put(("error", index, (f"{type(exc).__name__}: {exc}", None)))
        raise SystemExit(1) from None
    raise SystemExit(0 if result.drained else 3)


def _latch(event) -> Callable[[], bool]:
    """``event.is_set`` that stops asking once it was True: a multiprocessing Event takes a lock that a
    worker killed while holding it would never release, hanging every readiness probe."""
    state = {"set": False}

    def is_set() -> bool:
        if not state["set"]:
            state["set"] = event.is_set()
        return state["set"]

    return is_set


class WorkerPool:
    """The supervisor's view: its workers, and a ServeResult for the command's output."""

    def __init__(self, source: str, model_defaults: ModelConfig, config: ServerConfig, log: Callable[[str], None]):
        self.source, self.model_defaults, self.config, self.log = source, model_defaults, config, log
        self.ctx = multiprocessing.get_context("spawn")
        self.events = self.ctx.Queue()
        self.all_ready = self.ctx.Event()
        self.http = _bind_http(config.host, config.http_port)
        self.http_port = self.http.getsockname()[1]
        self.grpc_reservation, self.grpc_port = (None, None)
        if config.grpc_port is not None:
            try:
                self.grpc_reservation, self.grpc_port = _reserve_grpc(config.host, config.grpc_port)
            except UsageError:
                self.http.close()
                raise
        reap_stale_dirs()
        self.metrics_dir = owned_tempdir("onnxaccel-metrics-")
        self._previous_env = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        # In the environment before any worker starts: prometheus_client picks its storage at import.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir
        self.worker_config = replace(config, http_port=self.http_port, grpc_port=self.grpc_port)
        #: The system shared memory registry every worker reads and writes (serve/shared_memory.py): a region
        #: registered through one worker is seen by all. A private folder (0700): it names /dev/shm objects.
        self.shm_dir = owned_tempdir("onnxaccel-shm-") if config.shared_memory != "none" else None
        self.worker_config = replace(self.worker_config, shared_memory_dir=self.shm_dir)
        #: With shared_models: the model process, and the Unix socket (in a private folder) it listens on.
        self.host: multiprocessing.Process | None = None
        self.socket_dir = None
        if config.shared_models:
            # A private folder (mode 0700: the socket carries pickles, so only this user may connect). Unix
            # socket paths are limited to 107 bytes (sun_path): a long TMPDIR falls back to /tmp.
            self.socket_dir = owned_tempdir("onnxaccel-models-")
            if len(os.path.join(self.socket_dir, "models.sock")) > 100:
                shutil.rmtree(self.socket_dir, ignore_errors=True)
                self.socket_dir = owned_tempdir("onnxaccel-models-", "/tmp")
            self.worker_config = replace(self.worker_config, model_socket=os.path.join(self.socket_dir, "models.sock"))
        self.processes: dict[int, multiprocessing.Process] = {}
        self.ready_reports: dict[int, dict] = {}
        #: Where the time to ready went (every process's spans), once every worker reported ready.
        self.startup: dict | None = None
        self.stopping = False
        self.restarts: list[float] = []

    def start(self, index: int) -> None:
        """Start worker process ``index`` (with Ctrl+C ignored: the supervisor turns it into a drain)."""
        process = self.ctx.Process(
            target=_worker_main, name=f"onnxaccel-serve-{index}", daemon=False,
            args=(index, self.source, self.model_defaults, self.worker_config, self.http, self.metrics_dir,
                  self.events, self.all_ready, os.getpid()))
        # Workers ignore Ctrl+C (it reaches the whole process group): the supervisor turns it into one
        # SIGTERM each, which drains them; an ignored signal stays ignored in the new process until the
        # worker's server installs its own handlers.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            process.start()
        finally:
            signal.signal(signal.SIGINT, previous)
        self.processes[index] = process

    def start_host(self) -> None:
        """Start the model process (``--shared-models``): it loads every model and then listens."""
        self.host = self.ctx.Process(
            target=host_main, name="onnxaccel-models", daemon=False,
            args=(self.source, self.model_defaults, self.worker_config, self.worker_config.model_socket,
                  self.metrics_dir, self.events, os.getpid()))
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as for workers (see start)
        try:
            self.host.start()
        finally:
            signal.signal(signal.SIGINT, previous)

    def wait_host(self) -> None:
        """Until the model process loaded its models and listens; UsageError with its error."""
        while not self.stopping:
            try:
                kind, _index, payload = self.events.get(timeout=0.2)
            except queue_module.Empty:
                if self.host.exitcode is not None:
                    raise UsageError(f"The model process exited with status {self.host.exitcode} while loading.",
                                     "See its error above.") from None
                continue
            if kind == "error" and _index >= 0:  # a worker, started beside the model process, failed first
                message, hint = payload
                raise UsageError(f"Server worker {_index}: {message}", hint or "--workers 1 runs the same server "
                                 "in one process, with the full error.")
            if kind == "error":
                message, hint = payload
                raise UsageError(f"Model process: {message}", hint or "See the log above.")
            if kind == "ready":  # not before the models are described, but kept if it were
                self.ready_reports[_index] = payload
            if kind == "models-ready":
                self._merge_startup("model process", payload)
                return
        raise _Stopped()

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Until every worker reported ready; raises UsageError with the first worker's error."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(self.ready_reports) < len(self.processes):
            if self.stopping:
                return
            if self.host is not None and self.host.exitcode is not None:
                raise UsageError(f"The model process exited with status {self.host.exitcode} while the workers "
                                 "were starting.", "See its error above; --workers 1 without --shared-models "
                                 "shows the model's error in one process.")
            try:
                kind, index, payload = self.events.get(timeout=0.2)
            except queue_module.Empty:
                if self.stopping:
                    return
                dead = [i for i, p in self.processes.items() if p.exitcode is not None and i not in self.ready_reports]
                if dead:
                    raise UsageError(f"Server worker {dead[0]} exited with status "
                                     f"{self.processes[dead[0]].exitcode} while loading.",
                                     "Run with --workers 1 to see its error.")
                if deadline is not None and time.monotonic() > deadline:
                    raise UsageError("The server workers did not load their models in time.", "See the log above.")
                continue
            if kind == "error":
                message, hint = payload
                raise UsageError(f"Server worker {index}: {message}", hint or "--workers 1 runs the same server in "
                                 "one process, with the full error.")
            self.ready_reports[index] = payload
            if len(self.ready_reports) == 1:
                self._merge_startup(f"worker {index}", payload)
        self.all_ready.set()

    def _merge_startup(self, process: str, report: dict) -> None:
        """Place another process's start-up spans on this one's time scale, labelled ``process``."""
        started = report.get("startup") or {}
        offset = float(report.get("process_start", startup.PROCESS_START)) - startup.PROCESS_START
        startup.merge(started.get("spans", ()), offset=offset, process=process)

    def result(self) -> ServeResult:
        """The serve result, from the first worker's ready report."""
        first = self.ready_reports.get(min(self.ready_reports)) if self.ready_reports else {}
        grpc = f"{self.config.host}:{self.grpc_port}" if self.grpc_port else None
        return ServeResult(f"http://{self.config.host}:{self.http_port}", grpc, first.get("models", []),
                           True, list(first.get("warnings", [])), workers=len(self.processes),
                           startup=self.startup)

    def supervise(self) -> None:
        """Until stopping: replace a worker that dies; give up (UsageError) when workers keep dying, as
        gunicorn does, rather than reloading a model that cannot load forever."""
        while not self.stopping:
            self._drain_events()
            sentinels = {p.sentinel: i for i, p in self.processes.items()}
            if self.host is not None:
                sentinels[self.host.sentinel] = -1
            for sentinel in wait(list(sentinels), timeout=0.5):
                if self.stopping:
                    break
                index = sentinels[sentinel]
                process = self.host if index < 0 else self.processes[index]
                what = "the model process" if index < 0 else f"server worker {index}"
                process.join()
                self._mark_dead(process.pid)
                now = time.monotonic()
                self.restarts = [t for t in self.restarts if now - t < RESTART_WINDOW_S] + [now]
                if len(self.restarts) > MAX_RESTARTS:
                    raise UsageError(f"Server processes exited {len(self.restarts)} times within "
                                     f"{RESTART_WINDOW_S:.0f} s (the last: {what}, status {process.exitcode}); "
                                     "stopping.", "Run with --workers 1 to see the error in one process.")
                self.log(f"{what} (pid {process.pid}) exited with status {process.exitcode}; starting a new one.")
                time.sleep(min(5.0, 0.25 * 2 ** (len(self.restarts) - 1)))
                if self.stopping:
                    break
                if index < 0:  # the workers reconnect to the new one by themselves
                    self.start_host()
                else:
                    self.ready_reports.pop(index, None)
                    self.start(index)

    def _drain_events(self) -> None:
        """Reports of replacement workers: ready ones are noted, errors told to the user (and the queue's pipe
        never fills up)."""
        while True:
            try:
                kind, index, payload = self.events.get_nowait()
            except (queue_module.Empty, OSError, ValueError):
                return
            if kind == "ready":
                self.ready_reports[index] = payload
            elif kind == "error":
                self.log(f"{'model process' if index < 0 else f'server worker {index}'}: {payload[0]}")

    def stop(self) -> bool:
        """SIGTERM every worker, wait for their drains; True when all exited 0."""
        self.stopping = True
        for process in self.processes.values():
            if process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.drain_timeout_s + EXIT_GRACE_S
        clean = True
        for index, process in self.processes.items():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.kill()
                process.join()
            # A worker stopped while it was still loading had nothing to drain.
            stopped_loading = process.exitcode == -signal.SIGTERM and index not in self.ready_reports
            clean = clean and (process.exitcode == 0 or stopped_loading)
            self._mark_dead(process.pid)
        if self.host is not None:  # after the workers: it answers their in-flight requests until they leave
            if self.host.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.host.pid, signal.SIGTERM)
            self.host.join(max(EXIT_GRACE_S, deadline - time.monotonic()))
            if self.host.exitcode is None:
                self.host.kill()
                self.host.join()
            clean = clean and self.host.exitcode in (0, -signal.SIGTERM, None)
            self._mark_dead(self.host.pid)
        return clean

    def close(self) -> None:
        """Release what the parent holds: sockets, port reservation, event queue, metrics folder, environment."""
        self.http.close()
        if self.grpc_reservation is not None:
            self.grpc_reservation.close()
        self.events.close()
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        for folder in (self.socket_dir, self.shm_dir):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        if self._previous_env is None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = self._previous_env

    def _mark_dead(self, pid: int | None) -> None:
        if pid is None:
            return
        with contextlib.suppress(Exception):
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(pid, self.metrics_dir)


class _Stopped(Exception):
    """Stopping was asked for before the server was up."""


def _warn(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")
    sys.stderr.flush()


def serve_workers(source: str, model_defaults: ModelConfig, config: ServerConfig, on_ready=None,
                  log: Callable[[str], None] | None = None) -> ServeResult:
    """Run ``config.workers`` server processes until SIGTERM/SIGINT; blocking."""
    if config.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {config.workers}.", "e.g. --workers 4")
    from onnxaccel.serve.metrics import ServerMetrics  # noqa: F401 - fails early when prometheus-client is missing

    pool = WorkerPool(source, model_defaults, config, log or _warn)
    previous = {}

    def request_stop(_signum, _frame) -> None:
        pool.stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, request_stop)
    try:
        with startup.stage("workers", detail=f"{config.workers} process(es)"):
            if config.shared_models:
                pool.start_host()
            # The workers start (spawn, import) while the model process loads, and connect to it once it
            # listens (serve/model_link.py retries): ready after the longer of the two, not after both.
            for index in range(config.workers):
                pool.start(index)
            if config.shared_models:
                pool.wait_host()
            pool.wait_ready()
        pool.startup = startup.summary(ready=True).to_dict()
        if not pool.stopping:
            if on_ready is not None:
                on_ready(pool)
            pool.supervise()
        drained = pool.stop()
    except _Stopped:  # SIGTERM while the model process was loading: nothing was serving
        drained = pool.stop()
    except BaseException:
        pool.stop()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        pool.close()
    result = pool.result()
    result.drained = drained
    return result
