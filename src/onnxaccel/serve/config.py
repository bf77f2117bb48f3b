"""Serving configuration: per model (a repository folder's ``config.json``) and for the server.

A model's config::

    {"target": "cuda:0", "precision": "fp16", "max_batch": 32, "max_queue_delay_ms": 2, "queue_delay": "adaptive",
     "max_padding": 0.25, "warm_all_sizes": false,
     "instances": 1, "shapes": {"sequence": 128}, "max_queue": 256, "timeout_ms": 30000,
     "arena_extend_strategy": "kSameAsRequested", "gpu_mem_limit": 8589934592, "arena_shrinkage": true,
     "session_per_batch_size": true, "shape_buckets": "sequence=32,64,128,256",
     "preprocess": "imagenet", "embed_preprocess": "auto", "options": {"prefer_nhwc": "1"}}

Every key is optional; the command line gives the defaults. Unknown keys are an error that names them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from collections.abc import Mapping
from pathlib import Path

from onnxaccel.engines.buckets import ShapeBuckets
from onnxaccel.errors import UsageError
from onnxaccel.inputs_files import PRESETS
from onnxaccel.model import Model
from onnxaccel.plan import ExecutionPlan, Host, PlanRequest, plan_execution
from onnxaccel.target import Target, parse_target

SCHEMA = "onnxaccel.serve.model-config/1"
#: How the first request of a batch waits for others (ModelConfig.queue_delay).
QUEUE_DELAYS = ("adaptive", "fixed", "fill")
#: How a GPU model's instances use the device (ModelConfig.streams).
STREAMS = ("own", "shared", "serial")
#: ModelConfig.embed_preprocess values.
EMBED_MODES = ("auto", "none")
#: ServerConfig.shared_memory values (--shared-memory).
SHARED_MEMORY_MODES = ("system", "none")

@dataclass(frozen=True)
class ModelConfig:
    """How one model is served."""

    name: str
    source: str
    #: Text (a config.json's, or a flag's) or a Target; parsed once into :attr:`target_value`.
    target: str | Target = "cpu"
    precision: str | None = None
    #: Largest batch the dynamic batcher forms; 0 or 1 turns batching off.
    max_batch: int = 8
    max_queue_delay_ms: float = 2.0
    #: "adaptive": a batch waits out max_queue_delay_ms only while another request for the model is on its way
    #: (its body being read or decoded by this server process); with none, waiting could not fill the batch, so
    #: it runs at once. "fixed": it always waits, as Triton's dynamic batcher. The model process of
    #: --shared-models reads its workers' counts (serve/arena.py); Ray's replicas wait as with "fixed".
    queue_delay: str = "adaptive"
    #: Models run in padded batch sizes (GPUs): the largest share of a batch that may be padding. When the
    #: waiting rows would need more, the batch is cut to the padded size below and the rest wait for the next
    #: batch (17 rows: 16 now and 1 next, instead of 32 with 15 rows of padding). 1 never cuts.
    max_padding: float = 0.25
    #: GPUs: warm every padded size before the model is ready; False: the largest (every batch fits it, padded),
    #: the others in the background, each used once warm on every instance (plan_sizes.warm_at_load).
    warm_all_sizes: bool = False
    instances: int = 1
    #: Several instances on a GPU: "shared" (one device stream: their runs queue in launch order), "serial" (a
    #: stream each, one run at a time), "own" (a stream each: their runs go side by side); None lets the plan
    #: choose (plan.py _streams).
    streams: str | None = None
    shapes: dict[str, list[int] | int] = field(default_factory=dict)
    #: Requests waiting in this model's queue before new ones are refused with 429.
    max_queue: int = 256
    #: Per-request deadline (queue + run), milliseconds; 0 = none.
    timeout_ms: float = 30000.0
    arena_extend_strategy: str | None = None
    gpu_mem_limit: int | None = None
    #: Shrink the memory arenas after each run (RunOptions memory.enable_memory_arena_shrinkage).
    arena_shrinkage: bool = False
    #: GPUs: one session per padded batch size, so no session ever changes input shape (see load_instance).
    session_per_batch_size: bool = True
    #: Shape buckets of the model's symbolic dims (engines/buckets.py ShapeBuckets text, e.g.
    #: ``sequence=32,64,128``): each request is padded to the smallest bucket that fits, batched only with
    #: requests of the same bucket, and its outputs cropped back; every bucket is warmed at load. None: requests
    #: run at their own shapes (batched only with requests of the same shape).
    shape_buckets: str | None = None
    #: The image preset (imagenet, yolo, scale01, none) encoded-image requests are preprocessed by, for a model
    #: taking float NCHW (serve/images.py); None: the model's metadata decides, and without one the model takes
    #: no encoded images. A model with embedded preprocessing uses its embedded preset.
    preprocess: str | None = None
    #: "auto": on a GPU target, a float NCHW image model given an embeddable ``preprocess`` (imagenet, yolo,
    #: scale01) is served with that preprocessing embedded in its graph (transform/embed_preprocess.py): it takes
    #: uint8 NHWC pixels and encoded images decode to uint8. "none": the model is served as it is.
    embed_preprocess: str = "auto"
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.max_padding, (int, float)) or not 0 <= self.max_padding <= 1:
            raise UsageError(f"Model '{self.name}': max_padding is {self.max_padding!r}; it is the largest share of "
                             "a padded batch that may be padding, from 0 to 1.",
                             "Use e.g. 0.25 (the default), or 1 to never cut a batch.")
        if self.queue_delay not in QUEUE_DELAYS:
            raise UsageError(f"Model '{self.name}': queue_delay is {self.queue_delay!r}.",
                             "Use adaptive (wait only while other requests are on their way), fixed (always wait "
                             "max_queue_delay_ms, as Triton) or fill (adaptive, and under load a batch that is not "
                             "full also waits while another instance's batch runs; the default for several "
                             "instances on a GPU).")
        if self.streams is not None and self.streams not in STREAMS:
            raise UsageError(f"Model '{self.name}': streams is {self.streams!r}.",
                             "Use shared (the instances' runs queue on one device stream), serial (a stream "
                             "each, one run at a time) or own (a stream each, runs side by side).")
        if self.embed_preprocess not in EMBED_MODES:
            raise UsageError(f"Model '{self.name}': embed_preprocess is {self.embed_preprocess!r}.",
                             "Use auto (embed the preset on GPU targets) or none (serve the model as it is).")
        if self.preprocess is not None and self.preprocess not in PRESETS:
            raise UsageError(f"Model '{self.name}': preprocess is {self.preprocess!r}, not an image preset.",
                             f"Use one of {', '.join(PRESETS)} (the preset encoded-image requests get).")
        # The one parse of this model's target (text from a config.json, or the server's Target as it is).
        target = parse_target(self.target, precision=self.precision,
                              options={k: str(v) for k, v in self.options.items()})
        object.__setattr__(self, "_target", target)

    @property
    def target_value(self) -> Target:
        """The model's Target: parsed once, when the configuration was made (text from a config.json or a flag),
        with ``precision`` and ``options`` applied."""
        return self._target

    def plan(self, model: Model | None = None, *, host: Host | None = None) -> ExecutionPlan:
        """The ExecutionPlan serving this model (plan.py): target options (arena, session threads), padded batch
        sizes, graph capture where the model allows it, embedded preprocessing. The server's layout (workers,
        instances, automatic graph capture) was planned before the models loaded; this plan refines it for the
        model's signature."""
        request = PlanRequest(command="serve", max_batch=self.max_batch, max_padding=self.max_padding,
                              warm_all_sizes=self.warm_all_sizes,
                              instances=self.instances, session_per_batch_size=self.session_per_batch_size,
                              shapes=self.shape_bindings(), shape_buckets=self.shape_buckets_text,
                              preprocess=self.preprocess, embed_preprocess=self.embed_preprocess,
                              arena_extend_strategy=self.arena_extend_strategy, gpu_mem_limit=self.gpu_mem_limit,
                              arena_shrinkage=self.arena_shrinkage, auto_graph=False, queue_delay=self.queue_delay,
                              streams=self.streams)
        return plan_execution(self._target, request, model=model, host=host)

    def shape_bindings(self) -> dict[str, tuple[int, ...]]:
        """The configured shapes as tuples (a bare integer binds a one-dimensional shape)."""
        return {k: tuple(v) if isinstance(v, list) else (int(v),) for k, v in self.shapes.items()}

    @property
    def shape_buckets_text(self) -> str | None:
        """``shape_buckets`` as canonical text (None without)."""
        buckets = self.buckets()
        return buckets.describe() if buckets is not None else None

    def buckets(self) -> ShapeBuckets | None:
        """The parsed ``shape_buckets`` (a ShapeError naming the text when it does not parse), or None."""
        if not self.shape_buckets:
            return None
        if isinstance(self.shape_buckets, ShapeBuckets):
            return self.shape_buckets
        return ShapeBuckets.parse(str(self.shape_buckets))

    def to_dict(self) -> dict:
        """JSON-ready form of the model configuration (schema ``SCHEMA``)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["target"] = str(self.target)
        return {"schema": SCHEMA, **data}


_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)} - {"name"}


def model_defaults(values: ModelConfig | Mapping | None = None) -> ModelConfig:
    """The defaults every model of a server gets, as a ModelConfig whose name and source are unset: a
    ModelConfig as it is, or made once from a mapping of its keys (the Python API's ``{"target": "cuda:0",
    "max_batch": 32}``), its target parsed then."""
    if isinstance(values, ModelConfig):
        return values
    values = dict(values or {})
    unknown = sorted(set(values) - _FIELDS)
    if unknown:
        raise UsageError(f"Unknown model default(s): {', '.join(unknown)}.", f"Known keys: {', '.join(sorted(_FIELDS))}.")
    values.setdefault("source", "")
    return ModelConfig(name="", **values)


def model_config_from(name: str, source: str, defaults: ModelConfig, file: Path | None) -> ModelConfig:
    """The server's defaults for every model (a ModelConfig whose name and source are unset), overridden by
    ``file`` (a config.json) when there is one."""
    values = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(defaults)}
    values.update(name=name, source=defaults.source or source)
    if file is not None and file.exists():
        values.update(read_config_file(file))
    return ModelConfig(**values)


def read_config_file(path: Path) -> dict:
    """Read a JSON model configuration file; a UsageError naming the file when it is unreadable or has unknown keys."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"Cannot read the model config {path}: {exc}",
                         "Write it as a JSON object, e.g. {\"target\": \"cuda:0\", \"max_batch\": 16}.") from None
    if not isinstance(data, dict):
        raise UsageError(f"The model config {path} must be a JSON object.", "e.g. {\"max_batch\": 16}")
    data.pop("schema", None)
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise UsageError(f"The model config {path} has unknown key(s): {', '.join(unknown)}.",
                         f"Known keys: {', '.join(sorted(_FIELDS))}.")
    return data


@dataclass(frozen=True)
class ServerConfig:
    """The server: where it listens, its limits, and the defaults every model gets."""

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int | None = 8001
    #: Largest request body (HTTP) or message (gRPC), bytes; larger ones get 413 / RESOURCE_EXHAUSTED.
    max_request_bytes: int = 64 * 1024 * 1024
    #: Concurrent HTTP connections+requests uvicorn admits before answering 503 (bounds memory).
    max_connections: int = 1024
    #: Seconds SIGTERM waits for in-flight requests before closing.
    drain_timeout_s: float = 30.0
    #: Ready means every model loaded (True) or at least one (False).
    strict_readiness: bool = False
    #: Seconds between GPU telemetry samples for /metrics; 0 turns them off.
    telemetry_interval_s: float = 1.0
    log_level: str = "warning"
    #: Server processes sharing the ports, each with its own copy of every model (see serve/workers.py).
    workers: int = 1
    #: With workers: one model process holds the models and batches every worker's requests; the workers only
    #: decode (serve/model_host.py). Otherwise each worker has its own copy.
    shared_models: bool = False
    #: Internal: a worker's Unix socket to the model process (set by the supervisor with shared_models).
    model_socket: str | None = None
    #: Python's GIL switch interval in the server process (sys.setswitchinterval), milliseconds. The run threads
    #: need the GIL briefly around every model run and every batch copy; with the default 5 ms, an event loop
    #: busy decoding requests makes each of those waits up to 5 ms (measured: 11.5 ms instead of 1.2 ms per
    #: batch of a small model with a thread allocating request buffers; 3.2 ms at 0.5 ms).
    gil_switch_ms: float = 0.5
    #: How run threads wait for the GPU: block, spin, yield, or auto (the runtime's default). CUDA's block
    #: sleeps until the GPU signals; ROCm's polls up to 100 us first, and its spin and yield are one active wait
    #: (engines/hostmem.py GPU_WAIT_EFFECT, with the HIP source it follows). Blocking leaves the cores to the
    #: event loops of the server's processes.
    gpu_wait: str = "block"
    #: --shared-models with graph capture: page-lock the workers' arenas in the model process and copy each
    #: request straight to the GPU (no host join); False joins on the host first.
    direct_copy: bool = True
    #: Keep serving (503 for the models that failed) when no model could be loaded at start; False: a server
    #: whose every model failed stops with the reasons and a non-zero exit.
    allow_unavailable: bool = False
    # -- connection discipline (serve/security.py; docs/SECURITY.md gives the reasons for each default) --
    #: Seconds a request's line and headers may take from its first byte (or from the connection); then 408
    #: and close (nginx client_header_timeout).
    header_timeout_s: float = 10.0
    #: Bytes a request's line and headers may take; then 431 and close (uvicorn's h11 default is 16 KiB; httptools
    #: has no limit of its own).
    max_header_bytes: int = 64 * 1024
    #: Seconds allowed between two reads of a request body; then 408 and close (nginx client_body_timeout).
    body_timeout_s: float = 30.0
    #: Seconds a whole request body may take from its first read; then 408 and close (a body trickled a byte at
    #: a time within body_timeout_s would otherwise hold its connection and its bytes for ever).
    body_deadline_s: float = 300.0
    #: Seconds an idle keep-alive connection stays open between requests (uvicorn timeout_keep_alive).
    keep_alive_s: float = 30.0
    #: Request-body bytes all connections together may hold; a body that would pass it gets 503 + Retry-After
    #: before it is read. At least max_request_bytes.
    max_inflight_bytes: int = 256 * 1024 * 1024
    #: Largest all-JSON inference body (no binary tensor part): JSON numbers cost ~10x their text when parsed.
    max_json_bytes: int = 16 * 1024 * 1024
    #: Largest body on every route other than inference (repository index/load/unload, metadata, ...).
    max_control_bytes: int = 64 * 1024
    # -- security --
    #: Bearer token every route but health (and /metrics unless auth_metrics) needs; None: no auth.
    auth_token: str | None = field(default=None, repr=False)
    auth_metrics: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    #: With TLS: the CA that must sign client certificates (mutual TLS); None: no client certificate asked.
    tls_client_ca: str | None = None
    #: Repository load/unload through the API: "none" (refused, 403) or "explicit" (as Triton's
    #: --model-control-mode).
    model_control: str = "none"
    #: Triton's system shared memory extension (serve/shared_memory.py): "system" (clients on this host register
    #: regions of their own user's /dev/shm objects and name them for inputs and outputs) or "none" (refused,
    #: 400 / INVALID_ARGUMENT).
    shared_memory: str = "none"
    #: Internal: the private folder of the shared memory registry every worker reads (set by the supervisor
    #: with --workers); None: the registry is in memory (one process).
    shared_memory_dir: str | None = None

    def __post_init__(self) -> None:
        if self.shared_memory not in SHARED_MEMORY_MODES:
            raise UsageError(f"shared_memory is {self.shared_memory!r}.", "Use system (Triton's system shared memory "
                             "extension) or none; CUDA shared memory is not offered.")
        if self.max_inflight_bytes < self.max_request_bytes:
            object.__setattr__(self, "max_inflight_bytes", self.max_request_bytes)

    def to_dict(self) -> dict:
        """JSON-ready form of the server configuration (the token itself left out)."""
        data = dataclasses.asdict(self)
        data["auth_token"] = "<set>" if self.auth_token else None
        return data
