"""The protocol-independent server: health, metadata, inference, statistics, drain. HTTP and gRPC are thin
adapters over :class:`InferenceService`.

Version handling: every model has one version, "1"; an empty version means it (the protocol lets the server
choose, inference_rest.md "Model Ready"); any other version is 404.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from onnxaccel import __version__
from onnxaccel.serve.batcher import DynamicBatcher, OnTheWay
from onnxaccel.serve.config import ServerConfig
from onnxaccel.serve.signature import VERSION
from onnxaccel.serve.images import ImageInput, decode_request
from onnxaccel.serve.metrics import ServerMetrics
from onnxaccel.serve.peer import ClientRegions
from onnxaccel.serve.protocol import InferRequest, ProtocolError
from onnxaccel.serve.repository import READY, ModelRepository
from onnxaccel.serve.shared_memory import SharedMemoryRegistry, registry_for

SERVER_NAME = "onnxaccel"
#: Protocol extensions offered (names as Triton's server metadata lists them); and with --shared-memory system,
#: SHARED_MEMORY_EXTENSION (extension_shared_memory.md).
EXTENSIONS = ["binary_tensor_data", "model_repository", "statistics", "model_configuration"]
SHARED_MEMORY_EXTENSION = "system_shared_memory"
UNKNOWN_MODEL = "_unknown"
#: Retry-After (seconds) on the 503s of a draining server: a client retries elsewhere, or here after a restart.
DRAIN_RETRY_AFTER_S = 1


def _stats_entry(name: str, s: dict) -> dict:
    """One model in the shape of Triton's statistics extension (extension_statistics.md)."""
    def duration(count: float, seconds: float) -> dict:
        return {"count": round(count), "ns": int(seconds * 1e9)}

    # perf_analyzer requires queue, compute_input, compute_infer and compute_output to have the same count. The
    # input join/copy and the output split are timed inside the batch's run: their time is in compute_infer.
    served = s["served"]
    return {
        "name": name, "version": VERSION, "last_inference": int(s["last"] * 1e3),
        "inference_count": round(s["rows"]), "execution_count": round(s["executions"]),
        "inference_stats": {"success": duration(s["success_count"], s["success_s"]),
                            "fail": duration(s["fail_count"], s["fail_s"]),
                            "queue": duration(served, s["queue_s"]), "compute_input": duration(served, 0.0),
                            "compute_infer": duration(served, s["compute_s"]),
                            "compute_output": duration(served, 0.0)},
        "batch_stats": [],
    }


class InferenceService:
    """The protocol-independent server: health, metadata, model control and inference, shared by HTTP and gRPC."""
    def __init__(self, repository: ModelRepository, metrics: ServerMetrics, config: ServerConfig):
        self.repository = repository
        self.metrics = metrics
        self.config = config
        self.draining = False
        self.loaded = False
        self.inflight = 0
        #: Requests of this process waiting on each model: the queue gauge is 0 when none is (the batcher's own
        #: count, read as requests leave, may still hold ones that left through a timeout).
        self._waiting: dict[str, int] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        #: With several workers: True once every worker has loaded its models (readiness waits for all).
        self.peers_ready: Callable[[], bool] = lambda: True
        #: The system shared memory regions (shared with the other workers), or None with --shared-memory none.
        self.shm: SharedMemoryRegistry | None = registry_for(config)

    # -- health and metadata ---------------------------------------------------------------------------

    def live(self) -> bool:
        """Liveness: true until the server starts draining."""
        return not self.draining

    def ready(self) -> bool:
        """Readiness: loaded, not draining, peers ready, and every (strict) or any model ready."""
        if self.draining or not self.loaded or not self.peers_ready():
            return False
        states = [e.state == READY for e in self.repository.entries.values()]
        return bool(states) and (all(states) if self.config.strict_readiness else any(states))

    def readiness(self) -> dict:
        """What GET /v2/health/ready answers besides its status: ``ready``, and when not, the server's ``state``
        (starting: its models are still loading; workers: other worker processes still start; draining; not
        ready: no model is) and each model's state and reason (a loading model's reason says its step). The probe
        answers without a token, so with a token set the models (names, reasons with paths) are left out."""
        ready = self.ready()
        body: dict = {"ready": ready}
        if not ready:
            body["state"] = ("draining" if self.draining else "starting" if not self.loaded else
                             "workers" if not self.peers_ready() else "not ready")
            if not self.config.auth_token:
                body["models"] = [e.index_entry() for e in self.repository.entries.values()]
        return body

    def server_metadata(self) -> dict:
        """Server name, version and protocol extensions, as the server metadata endpoint returns them."""
        extensions = EXTENSIONS + ([SHARED_MEMORY_EXTENSION] if self.shm is not None else [])
        return {"name": SERVER_NAME, "version": __version__, "extensions": extensions}

    def shared_memory(self, peer: Callable[[], tuple]) -> ClientRegions:
        """The system shared memory registry as the client of connection ``peer`` (serve/peer.py) sees it; 400
        when the server was started with --shared-memory none."""
        if self.shm is None:
            raise ProtocolError(400, "System shared memory is off on this server (--shared-memory none); send the "
                                "tensors in the request, or start the server with --shared-memory system.")
        return ClientRegions(self.shm, peer)

    def client_shm(self, peer: Callable[[], tuple]) -> ClientRegions | None:
        """What an inference request of connection ``peer`` decodes with: its client's regions, or None with
        --shared-memory none."""
        return ClientRegions(self.shm, peer) if self.shm is not None else None

    def _entry(self, name: str, version: str = ""):
        entry = self.repository.get(name)
        if version not in ("", VERSION):
            raise ProtocolError(404, f"Model '{name}' has no version '{version}'; it has version {VERSION}.")
        return entry

    def model_ready(self, name: str, version: str = "") -> bool:
        """True when the model (and version) is loaded and the server is not draining."""
        return self._entry(name, version).state == READY and not self.draining

    def model_metadata(self, name: str, version: str = "") -> dict:
        """The model's protocol metadata (inputs, outputs, versions)."""
        self._entry(name, version)
        return self.repository.ready(name).instance.metadata()

    def model_config(self, name: str, version: str = "") -> dict:
        """The model's configuration in Triton's model-config form; a batching model's ``parameters`` say which
        queue delay its batcher applies (``queue_delay``: adaptive or fill, or fixed where it cannot see arrivals)."""
        self._entry(name, version)
        entry = self.repository.ready(name)
        config = entry.instance.triton_config()
        if "dynamic_batching" in config:
            applied = "fixed"
            if getattr(entry.batcher, "adaptive", False):
                applied = "fill" if getattr(entry.config, "queue_delay", "") == "fill" else "adaptive"
            config["parameters"] = {**config.get("parameters", {}), "queue_delay": {"string_value": applied}}
        return config

    def model_stats(self, name: str = "", version: str = "") -> dict:
        """Inference statistics of one model, or of every ready model when no name is given."""
        names = [name] if name else [n for n, e in self.repository.entries.items() if e.state == READY]
        for n in names:
            self._entry(n, version)
        numbers = self.metrics.model_stats(names)
        return {"model_stats": [_stats_entry(n, numbers[n]) for n in names]}

    def metric_label(self, name: str) -> str:
        """The model label for metrics; unknown names share one label so clients cannot grow the label set."""
        return name if name in self.repository.entries else UNKNOWN_MODEL

    # -- inference -------------------------------------------------------------------------------------

    def expect(self, name: str) -> OnTheWay:
        """Count a request for model ``name`` as on its way in (its body being read) until it is queued or has
        failed: its batcher's adaptive delay waits for it. A no-op for models not ready here."""
        entry = self.repository.entries.get(name)
        return OnTheWay(entry.batcher if entry is not None and entry.state == READY else None)

    async def infer(self, request: InferRequest, on_the_way: OnTheWay | None = None
                    ) -> tuple[dict[str, np.ndarray], str]:
        """Validate, queue, run; the requested outputs and the model version. Raises ProtocolError.
        ``on_the_way``: the request's count from ``expect`` (released once it is queued); else one is taken here."""
        if self.draining:
            raise ProtocolError(503, "The server is shutting down and accepts no new requests.",
                                retry_after=DRAIN_RETRY_AFTER_S)
        with on_the_way or self.expect(request.model_name) as on_the_way:
            return await self._infer(request, on_the_way)

    async def _infer(self, request: InferRequest, on_the_way: OnTheWay) -> tuple[dict[str, np.ndarray], str]:
        entry = self._entry(request.model_name, request.model_version)
        entry = self.repository.ready(request.model_name)
        await decode_request(request, _image_input(entry.instance), self.config.workers)
        feeds, rows = entry.instance.validate(request)
        timeout = _timeout_s(request, entry.config.timeout_ms)
        self.inflight += 1
        self._idle.clear()
        self.metrics.inflight.inc()
        name = request.model_name
        self._waiting[name] = self._waiting.get(name, 0) + 1
        self.metrics.child(self.metrics.queue_length, name).set(entry.batcher.queued + 1)
        try:
            try:
                batcher = entry.batcher  # a DynamicBatcher queues at once; the model process's link when it runs
                queued = (batcher.enqueue if isinstance(batcher, DynamicBatcher) else batcher.submit)(
                    feeds, rows, timeout)
                on_the_way.release()  # queued: no longer on its way
                outputs, timing = await asyncio.wait_for(queued, timeout)
            except asyncio.TimeoutError:
                raise ProtocolError(503, f"Request to model '{request.model_name}' timed out after "
                                    f"{timeout * 1e3:.0f} ms (queue or run too slow: the server is overloaded).",
                                    retry_after=1) from None
        finally:
            self.inflight -= 1
            self.metrics.inflight.dec()
            self._waiting[name] -= 1
            queued = entry.batcher.queued if entry.batcher and self._waiting[name] else 0
            self.metrics.child(self.metrics.queue_length, name).set(min(queued, self._waiting[name]))
            if self.inflight == 0:
                self._idle.set()
        if request.outputs:
            outputs = {o.name: outputs[o.name] for o in request.outputs}
            for out in request.outputs:
                if out.shm is not None:  # into the client's shared memory (a 400 when it does not fit)
                    out.written = self.shm.write_output(out.shm, outputs[out.name], out.name)
        self.metrics.observe_success(request.model_name, max(0.0, timing.queue_s), timing.compute_s, time.time())
        return outputs, VERSION

    # -- repository ------------------------------------------------------------------------------------

    async def load(self, name: str) -> None:
        """Load (or reload) a model through the repository API; refused while draining."""
        self._control_allowed("load", name)
        if self.draining:
            raise ProtocolError(503, "The server is shutting down.", retry_after=DRAIN_RETRY_AFTER_S)
        self._single_process_only("load")
        entry = await self.repository.load(name)
        self.metrics.model_ready.labels(name).set(1 if entry.state == READY else 0)
        if entry.state != READY:
            raise ProtocolError(400, f"Failed to load model '{name}': {entry.reason}")

    async def unload(self, name: str) -> None:
        """Unload a model (single-process servers only)."""
        self._control_allowed("unload", name)
        self._single_process_only("unload")
        await self.repository.unload(name)
        self.metrics.model_ready.labels(name).set(0)

    def _control_allowed(self, action: str, name: str) -> None:
        """403 unless the server was started with --model-control explicit (Triton's --model-control-mode): an
        anonymous unload would take a model down for everyone."""
        if self.config.model_control != "explicit":
            raise ProtocolError(403, f"Cannot {action} model '{name}': the repository control API is off. Start the "
                                "server with --model-control explicit to allow load/unload requests.")

    def check_load_parameters(self, name: str, parameters: dict) -> None:
        """400 naming any load parameter this server does not apply: Triton's ``config`` (a config override)
        and ``file:<path>`` (model files in the request) are not offered; a load reads the repository folder."""
        self._control_allowed("load", name)
        unsupported = sorted(k for k in parameters if k == "config" or k.startswith("file:"))
        if unsupported:
            raise ProtocolError(400, f"Load of model '{name}': parameter(s) {', '.join(unsupported)} are not "
                                "supported (this server loads models from its repository folder only); edit "
                                f"{name}/config.json or the model file there and load again without them.")

    def _single_process_only(self, action: str) -> None:
        if self.config.workers > 1 and not self.config.shared_models:
            raise ProtocolError(400, f"Cannot {action} models through the API with --workers {self.config.workers}: "
                                "each worker process holds its own copy of every model and a request reaches only "
                                "one of them. Serve with --shared-models (one model process for all workers), "
                                "or change the repository and restart the server.")

    async def load_all(self) -> None:
        """Load every model of the repository at start-up, then mark the service loaded."""
        await self.repository.load_all()
        for name, entry in self.repository.entries.items():
            self.metrics.model_ready.labels(name).set(1 if entry.state == READY else 0)
        self.loaded = True

    # -- shutdown --------------------------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests and wait for in-flight ones (queued ones still get their batch, at most
        max_queue_delay later); True when all finished within ``timeout_s``."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False


def _image_input(instance) -> ImageInput | None:
    """The image input of a ModelInstance, or of a ModelSignature (a decoding worker's view of a model)."""
    return getattr(getattr(instance, "signature", instance), "image", None)


def _timeout_s(request: InferRequest, default_ms: float) -> float | None:
    """The request's own ``timeout`` parameter (microseconds, as Triton's clients send it) or the model's."""
    value = request.parameters.get("timeout")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return value / 1e6
    return default_ms / 1e3 if default_ms and default_ms > 0 else None
