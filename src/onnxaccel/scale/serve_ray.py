"""`serve --ray`: the same Open Inference Protocol server as a Ray Serve deployment, one replica per GPU,
autoscaling on the number of requests each replica holds.

Each replica builds what `onnxaccel serve` builds in its own process (a ModelRepository, an InferenceService with
its dynamic batcher and metrics) and answers through the very FastAPI app of ``onnxaccel.serve.http_app``, wrapped
with ``@serve.ingress``: routes, status codes, binary tensors and errors are those of `onnxaccel serve`. Ray
Serve's HTTP proxy spreads requests over the replicas (ray/serve/api.py ``ingress``: a builder function "is
evaluated when the deployment is initialized on replicas", after the class constructor; Ray 2.60.0).

What differs from `onnxaccel serve`: only HTTP (Ray Serve's gRPC proxy would need the KServe servicer registered
through ``grpc_options``, not done yet); ``/metrics`` and the statistics routes answer for the replica that got
the request; SIGTERM stops Serve after its proxies drain (``graceful_shutdown_timeout_s``).

Autoscaling (ray/serve/config.py ``AutoscalingConfig``, Ray 2.60.0): Serve averages each replica's ongoing
requests (queued in the replica plus running) over ``look_back_period_s`` and keeps it near
``target_ongoing_requests`` by adding or removing replicas between ``min_replicas`` and ``max_replicas``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import signal
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from onnxaccel.errors import OnnxAccelError, UsageError
from onnxaccel.scale.cluster import ray_cluster
from onnxaccel.serve.config import ModelConfig, ServerConfig, model_defaults as as_defaults
from onnxaccel.serve.core import InferenceService
from onnxaccel.serve.http_app import create_app
from onnxaccel.serve.metrics import ServerMetrics
from onnxaccel.serve.repository import ModelRepository
from onnxaccel.serve.server import ServeResult
from onnxaccel.target import Target

APP_NAME = "onnxaccel"
#: The replica's service; each replica is its own process (a Ray actor), so a module global is per replica.
_SERVICE = None


class ServeOnRayError(OnnxAccelError):
    """Ray Serve could not start the deployment."""


def _asgi_app():
    """The ingress builder: onnxaccel's own FastAPI app over the service this replica's constructor built."""
    return create_app(_SERVICE)


class ModelServerReplica:
    """One replica: the models of ``source`` loaded with ``model_defaults``, as `onnxaccel serve` loads them."""

    async def __init__(self, source: str, model_defaults: ModelConfig, config: dict):
        global _SERVICE

        metrics = ServerMetrics()
        repository = ModelRepository(source, model_defaults, on_batch=metrics.batch_observer)
        self.service = InferenceService(repository, metrics, ServerConfig(**config))
        await self.service.load_all()
        if not self.service.ready():
            raise RuntimeError(f"no model of {source} loaded: {self._reasons()}")
        _SERVICE = self.service

    def _reasons(self) -> str:
        return "; ".join(f"{e.name}: {e.reason}" for e in self.service.repository.entries.values() if e.reason)

    def check_health(self) -> None:
        """Ray Serve calls this periodically; raising marks the replica unhealthy and replaces it."""
        if not self.service.ready():
            raise RuntimeError(f"no model is ready ({self._reasons()})")


@dataclass(frozen=True)
class ReplicaPlan:
    """Fixed ``replicas``, or autoscaling between ``min_replicas`` and ``max_replicas``."""

    replicas: int | None
    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float
    max_ongoing_requests: int
    num_gpus: float
    num_cpus: float

    def deployment_options(self) -> dict:
        """Ray Serve deployment options for this plan (replicas or autoscaling, actor resources)."""
        actor = {"num_cpus": self.num_cpus}
        if self.num_gpus:
            actor["num_gpus"] = self.num_gpus
        options = {"ray_actor_options": actor, "max_ongoing_requests": self.max_ongoing_requests,
                   "health_check_period_s": 5, "graceful_shutdown_timeout_s": 10,
                   "max_constructor_retry_count": 3}
        if self.replicas is not None:
            options["num_replicas"] = self.replicas
        else:
            options["autoscaling_config"] = {
                "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "initial_replicas": self.min_replicas, "target_ongoing_requests": self.target_ongoing_requests,
                "upscale_delay_s": 5, "downscale_delay_s": 60,
            }
        return options

    def to_dict(self) -> dict:
        """JSON-ready form of the plan."""
        return dataclasses.asdict(self)


def plan_replicas(target: Target, cluster_gpus: float, cluster_cpus: float, *, replicas: int | None,
                  min_replicas: int, max_replicas: int | None, max_batch: int,
                  target_ongoing_requests: float | None, cpus_per_replica: float) -> ReplicaPlan:
    """One replica per GPU on GPU targets (max = the cluster's GPUs); on CPU, one per ``cpus_per_replica``."""
    gpu = target.is_gpu
    capacity = int(cluster_gpus) if gpu else max(1, int(cluster_cpus // max(cpus_per_replica, 1e-9)))
    if gpu and capacity < 1:
        raise UsageError(f"The target {target} needs GPUs, and the Ray cluster has none.",
                         "Start the cluster on GPU machines, or serve with --target cpu.")
    if replicas is not None and replicas > capacity:
        raise UsageError(f"--replicas {replicas} needs {replicas} {'GPUs' if gpu else 'CPU slots'}; the cluster has "
                         f"{capacity}.", f"Pass --replicas {capacity} or fewer.")
    target = target_ongoing_requests or float(max(2, 2 * max_batch))
    return ReplicaPlan(replicas, max(1, min_replicas), max(max_replicas or capacity, max(1, min_replicas)), target,
                       max(32, int(4 * target)), 1.0 if gpu else 0.0, cpus_per_replica)


class RayServer:
    """A running Ray Serve application; ``stop()`` deletes it (and the cluster, when started here)."""

    def __init__(self, url: str, plan: ReplicaPlan, cluster, owns_cluster_cm, config: ServerConfig):
        self.url = url
        self.plan = plan
        self.cluster = cluster
        self._cluster_cm = owns_cluster_cm
        self.config = config
        self.stopped = False

    def models(self) -> list[dict]:
        """The served models from the repository index endpoint, or none when the server does not answer."""
        with contextlib.suppress(OSError, ValueError):
            request = urllib.request.Request(f"{self.url}/v2/repository/index", data=b"{}", method="POST")
            with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - our own loopback URL
                return json.loads(response.read())
        return []

    def result(self) -> ServeResult:
        """The serve result: URLs, models and a warning naming the replica plan."""
        models = self.models()
        warnings = [f"Ray Serve: {self.plan.replicas or f'{self.plan.min_replicas}-{self.plan.max_replicas}'} "
                    f"replica(s); gRPC is not served on Ray (HTTP only)."]
        return ServeResult(self.url, None, models, True, warnings)

    def stop(self) -> None:
        """Shut the Ray Serve application down (once; later calls do nothing)."""
        if self.stopped:
            return
        self.stopped = True
        from ray import serve

        # While Serve shuts down, Ray's driver prints the controller's own death ("(raylet) Task
        # ServeController.graceful_shutdown failed ... killed by `ray.kill`", Ray 2.60) to sys.stdout; keep
        # stdout for results (`serve --json`).
        with contextlib.redirect_stdout(sys.stderr):
            with contextlib.suppress(Exception):
                serve.shutdown()  # deletes the application, its replicas and proxies
            self._cluster_cm.__exit__(None, None, None)


def start(source: str, model_defaults: ModelConfig | dict, config: ServerConfig, *, address: str = "auto",
          replicas: int | None = None, min_replicas: int = 1, max_replicas: int | None = None,
          target_ongoing_requests: float | None = None, cpus_per_replica: float = 1.0,
          local_cpus: int | None = None, local_object_store_mb: int | None = None,
          ready_timeout_s: float = 300.0) -> RayServer:
    """Deploy on the cluster at ``address`` (see scale.cluster) and wait until the server answers ready."""
    cluster_cm = ray_cluster(address, num_cpus=local_cpus, object_store_mb=local_object_store_mb)
    cluster = cluster_cm.__enter__()
    try:
        from ray import serve

        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        model_defaults = as_defaults(model_defaults)
        plan = plan_replicas(model_defaults.target_value, cluster.gpus, cluster.cpus, replicas=replicas,
                             min_replicas=min_replicas, max_replicas=max_replicas, max_batch=model_defaults.max_batch,
                             target_ongoing_requests=target_ongoing_requests, cpus_per_replica=cpus_per_replica)
        model_defaults = _replica_target(model_defaults, plan)
        port = config.http_port or _free_port(config.host)
        serve.start(http_options={"host": config.host, "port": port})
        deployment = serve.deployment(serve.ingress(_asgi_app)(ModelServerReplica), name="model-server")
        app = deployment.options(**plan.deployment_options()).bind(
            source, model_defaults, dataclasses.asdict(dataclasses.replace(config, grpc_port=None)))
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
        server = RayServer(f"http://{host}:{port}", plan, cluster, cluster_cm, config)
        _wait_ready(server.url, ready_timeout_s)
        return server
    except BaseException:
        with contextlib.suppress(Exception):
            from ray import serve

            serve.shutdown()
        cluster_cm.__exit__(None, None, None)
        raise


def run(source: str, model_defaults: ModelConfig | dict, config: ServerConfig,
        on_ready: Callable[[RayServer], None] | None = None, *, stop: threading.Event | None = None,
        **options) -> ServeResult:
    """Serve on Ray until SIGTERM/SIGINT (or ``stop`` is set); blocking, like ``serve.server.serve``.

    The signal handlers are installed after ``ray.init``, which sets its own SIGTERM handler (it exits the
    process: ray/_private/worker.py ``sigterm_handler``), so SIGTERM stops the application cleanly and exits 0."""
    stop = stop or threading.Event()
    server = start(source, model_defaults, config, **options)
    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: rely on ``stop``
                previous[sig] = signal.signal(sig, lambda *_: stop.set())
        if on_ready is not None:
            on_ready(server)
        while not stop.wait(0.5):
            pass
        return server.result()
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _replica_target(model_defaults: ModelConfig, plan: ReplicaPlan) -> ModelConfig:
    """GPU replicas see only their GPU, as device 0 (Ray sets CUDA/HIP_VISIBLE_DEVICES): drop a device id. CPU
    replicas: ONNX Runtime's pool defaults to every core, so N replicas on one node would oversubscribe it; give
    each the threads of the CPUs it reserves (unless the target sets them)."""
    target = model_defaults.target_value
    if target.is_gpu:
        target = dataclasses.replace(target, device_id=None)
    elif "intra_op_num_threads" not in target.option_dict:
        target = target.with_options({"intra_op_num_threads": str(max(1, int(plan.num_cpus)))})
    return dataclasses.replace(model_defaults, target=target, precision=None, options={})


def _wait_ready(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as response:  # noqa: S310 - loopback
                if response.status == 200:
                    return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise ServeOnRayError(f"The Ray Serve deployment did not become ready at {url} within {timeout_s:.0f} s ({last}).",
                          "Look at the replica logs under /tmp/ray/session_latest/logs/serve/.")


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host if host not in ("0.0.0.0", "::") else "127.0.0.1", 0))
        return sock.getsockname()[1]
