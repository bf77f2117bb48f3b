"""The ExecutionPlan: what will run and how, decided once per model x target x host.

Every command that executes a model (``run``, ``bench``, ``tune``, ``serve``, ``batch`` in-process and on Ray,
and the Python API) asks :func:`plan_execution` and hands the plan on as a typed value. Nothing downstream
parses a target string again or decides a second time whether to capture graphs, how many instances to build,
which preprocessing to embed or how the run threads wait for the GPU: they read the plan. Each decision is a
:class:`Choice` with its value and its reason, and every report prints the same "what will run" block
(:meth:`ExecutionPlan.lines`, :meth:`ExecutionPlan.to_dict`). docs/ARCHITECTURE.md, "The plan", lists the
decisions and where each was made before.

Provider facts (which option captures graphs, where a provider keeps its arena knobs, whether the server
captures by default) come from the provider's module (``onnxaccel.providers``); the plan only combines them
with the model, the host and what the user asked.

    plan = plan_execution(parse_target("cuda/fp16"), PlanRequest(command="serve", max_batch=64),
                          model=load_model("zoo:resnet50"))
    plan.target          # the Target the sessions are built with (graph capture, session threads applied)
    plan.graph_capture   # True, with plan.choice("graph_capture").reason saying why
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from onnxaccel import providers
from onnxaccel.model import Model
from onnxaccel.plan_types import Choice, Host, PlanRequest
from onnxaccel.plan_sizes import (DEFAULT_BATCH, DEFAULT_GPU_BATCH, batch_size, batch_sizes_for, fixed_batch,
                                  fixed_shapes_but_batch, has_batch_axis, instances_at_load, padded_sizes,
                                  warm_at_load)
from onnxaccel.target import Target, gpu_session_threads

__all__ = ["BATCH_GPU_INSTANCES", "COMMANDS", "DEFAULT_BATCH", "DEFAULT_GPU_BATCH", "EMBEDDABLE", "GIL_SWITCH_MS",
           "GPU_WAIT", "INSTANCE_WEIGHTS_LIMIT", "SCHEMA", "Choice", "ExecutionPlan", "Host", "PlanRequest",
           "batch_size", "embed_preset", "fixed_shapes_but_batch", "has_batch_axis", "padded_sizes", "plan_execution"]

SCHEMA = "onnxaccel.plan/1"

#: `serve` on a GPU target, no layout flag given: a decoding worker per CORES_PER_WORKER cores, at most
#: MAX_WORKERS, one shared model process, SERVE_GPU_INSTANCES instances (2 below 8 cores). The figures behind
#: these defaults are in docs/BENCHMARKS.md ("Serve").
CORES_PER_WORKER = 2
MAX_WORKERS = 8
SERVE_GPU_INSTANCES = 4
#: `batch` on a GPU target with padded batches: two sessions, so one copies its unit in while the other runs.
BATCH_GPU_INSTANCES = 2
#: A model whose weights take more than this runs one session per process (each session holds its weights).
INSTANCE_WEIGHTS_LIMIT = 2 << 30
#: How run threads wait for the GPU on GPU targets (engines/hostmem.py GPU_WAIT_EFFECT), and Python's GIL
#: switch interval there (milliseconds; Python's default is 5). Blocking leaves the cores to the event loops,
#: readers and decoders; a short switch interval lets a run thread whose call returned take the GIL back soon.
GPU_WAIT = "block"
GIL_SWITCH_MS = 0.5
#: Image presets that can be embedded in a model's graph (transform/embed_preprocess.py implements them).
EMBEDDABLE = ("imagenet", "yolo", "scale01")
COMMANDS = ("run", "bench", "tune", "serve", "batch", "compare", "profile")


@dataclass(frozen=True)
class ExecutionPlan:
    """What will run and how: the resolved target, precision, preprocessing, shapes, batch sizes, instances,
    graph capture, waits and arenas, each with the reason it was chosen (:attr:`choices`)."""

    command: str
    #: What the user asked for, and the target the sessions are built with (graph capture, session threads and
    #: arena options applied). Both are Target values; neither is ever turned back into text and parsed.
    requested: Target
    target: Target
    host: Host
    precision: str
    precision_native: bool
    embed_preprocess: str | None
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    shape_buckets: str | None
    #: The batch sizes sessions run at: serve's padded sizes, batch's one size, () where batches run as given.
    batch_sizes: tuple[int, ...]
    #: The sizes warmed before a server says it is ready (the rest warm in the background); all elsewhere.
    warm_at_load: tuple[int, ...]
    max_padding: float | None
    instances: int
    #: The instances built and warmed before a server says it is ready (the others join while it serves).
    instances_at_load: int
    workers: int
    shared_models: bool
    graph_capture: bool
    graph_option: str | None
    gpu_wait: str | None
    gil_switch_ms: float | None
    #: serve's batch-forming policy for every model (a model's config.json may set its own); None elsewhere.
    queue_delay: str | None
    #: serve, several instances on a GPU: "shared" (one device stream for the model's instances, made in the
    #: model process and handed to each session through the provider's stream_option), "serial" (streams of
    #: their own, one run at a time: engines/pool.py) or "own"; None elsewhere.
    streams: str | None
    arena_shrinkage: bool
    decoder: str | None
    choices: tuple[Choice, ...] = ()
    #: The precision the session computed in, per node (precision/executed.py ExecutedPrecision.to_dict()), for a
    #: model converted here; None until a runner was built (:meth:`with_executed`) or where the label is exact.
    precision_executed: dict | None = None

    @property
    def gil_switch_s(self) -> float | None:
        """The GIL switch interval in seconds (None: left as Python has it)."""
        return None if self.gil_switch_ms is None else self.gil_switch_ms / 1000.0

    @property
    def notes(self) -> list[str]:
        """The reasons of choices that changed what the user asked (e.g. graph capture dropped)."""
        return [c.reason for c in self.choices if c.overrides]

    def with_executed(self, executed: dict | None) -> ExecutionPlan:
        """The plan with the precision its session really computed in (``ExecutedPrecision.to_dict()``): the
        precision decision then states it (e.g. 'fp16 on 2 of 50 nodes, fp32 elsewhere'), so every command that
        prints or dumps the plan shows what ran, not only what was asked. ``None`` leaves the plan as it is."""
        if not executed:
            return self
        label, asked = executed["label"], self.precision
        reason = (f"as executed: every compute node of the profiled session ran in {asked}" if label == asked else
                  f"as executed: {asked} was asked, the other nodes ran in the precision shown (no {asked} kernel "
                  "or not converted: ONNX Runtime inserts casts)")
        choices = tuple(Choice("precision", label, reason, overrides=label != asked) if c.name == "precision" else c
                        for c in self.choices)
        return dataclasses.replace(self, choices=choices, precision_executed=dict(executed))

    def with_override(self, name: str, value: object, reason: str) -> ExecutionPlan:
        """The plan with decision ``name`` (and its field of the same name) changed to ``value`` for ``reason``,
        where what runs had to differ from what was planned (a device stream the runtime refused): every report
        then says what ran."""
        choices = tuple(Choice(name, value, reason, overrides=True) if c.name == name else c for c in self.choices)
        return dataclasses.replace(self, choices=choices, **{name: value})

    def choice(self, name: str) -> Choice | None:
        """The decision named ``name`` (None when the plan made none of that name)."""
        return next((c for c in self.choices if c.name == name), None)

    def to_dict(self) -> dict:
        """JSON-ready form (schema ``SCHEMA``): what every command's ``--json`` prints as "plan"."""
        return {
            "schema": SCHEMA, "command": self.command, "requested": str(self.requested), "target": str(self.target),
            "provider": self.target.provider if self.target.engine == "ort" else None,
            "host": {"cores": self.host.cores}, "precision": self.precision,
            "precision_native": self.precision_native, "embed_preprocess": self.embed_preprocess,
            "shapes": {k: list(v) for k, v in self.shapes}, "shape_buckets": self.shape_buckets,
            "batch_sizes": list(self.batch_sizes), "warm_at_load": list(self.warm_at_load),
            "max_padding": self.max_padding,
            "instances": self.instances, "instances_at_load": self.instances_at_load,
            "workers": self.workers, "shared_models": self.shared_models, "graph_capture": self.graph_capture,
            "graph_option": self.graph_option, "gpu_wait": self.gpu_wait, "gil_switch_ms": self.gil_switch_ms,
            "queue_delay": self.queue_delay, "streams": self.streams,
            "arena_shrinkage": self.arena_shrinkage, "decoder": self.decoder,
            "precision_executed": self.precision_executed, "choices": [c.to_dict() for c in self.choices],
        }

    def lines(self) -> list[str]:
        """The "what will run" block: one line per decision, as every command prints it."""
        return [f"{c.name}: {_text(c.value)} ({c.reason})" for c in self.choices]


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) or "-"
    return "-" if value is None else str(value)


# -- the decisions ----------------------------------------------------------------------------------------

def plan_execution(target: Target, request: PlanRequest | None = None, *, model: Model | None = None,
                   host: Host | None = None) -> ExecutionPlan:
    """The plan for running ``model`` (its signature; None before it is loaded, e.g. a server's layout) on
    ``target`` on ``host`` (default: this machine), as ``request`` asks. The one place these decisions are made."""
    request = request or PlanRequest()
    host = host or Host.here()
    choices: list[Choice] = []
    spec = providers.get(target.device)
    precision_native = target.precision_is_native
    choices.append(Choice("precision", target.precision, "the provider converts itself" if precision_native and
                          target.precision != "fp32" else "fp32: the model as it is" if target.precision == "fp32"
                          else "a converted model (the provider computes in the model's types)"))
    workers, shared, instances = _layout(target, request, host, choices)
    queue_delay = _queue_delay(target, request, instances, choices)
    batch_sizes = batch_sizes_for(target, request, model, choices)
    warm = warm_at_load(request, batch_sizes, choices)
    at_load = instances_at_load(target, request, instances, choices)
    effective, graph, graph_option = _graph_capture(target, request, model, batch_sizes, spec, choices)
    effective = _arena(effective, request, spec, graph, choices)
    streams = _streams(target, request, instances, spec, choices)
    threads = gpu_session_threads(effective) if request.command in ("serve", "batch") else {}
    if threads:
        effective = effective.with_options(threads)
        choices.append(Choice("session_threads", 1, "a GPU session's CPU pool runs only the few CPU-placed nodes; "
                              "one thread leaves the cores to the host work (set ?intra_op_num_threads=N to change)"))
    embed = _embed(target, request, choices)
    gpu_wait = request.gpu_wait or (GPU_WAIT if target.is_gpu and request.command in ("serve", "batch") else None)
    if gpu_wait:
        choices.append(Choice("gpu_wait", gpu_wait, "given" if request.gpu_wait else
                              "GPU target: run threads sleep until the GPU signals, leaving the cores to the host"))
    gil = request.gil_switch_ms
    if gil is None and target.is_gpu and request.command in ("serve", "batch"):
        gil = GIL_SWITCH_MS
    if gil is not None:
        choices.append(Choice("gil_switch_ms", gil, "given" if request.gil_switch_ms is not None else
                              "GPU target: a run thread whose call returned gets the GIL back within 0.5 ms"))
    decoder = request.decoder or ("auto" if request.command == "batch" else None)
    if decoder:
        choices.append(Choice("decoder", decoder, "given" if request.decoder else
                              "the fastest image decoder installed (prepost/decode.py)"))
    choices.insert(0, Choice("target", effective, "as given" if effective == target else
                             f"{target} with the plan's options"))
    return ExecutionPlan(
        command=request.command, requested=target, target=effective, host=host, precision=target.precision,
        precision_native=precision_native, embed_preprocess=embed,
        shapes=tuple(sorted((k, tuple(v)) for k, v in request.shapes.items())), shape_buckets=request.shape_buckets,
        batch_sizes=batch_sizes, warm_at_load=warm, max_padding=request.max_padding, instances=instances,
        instances_at_load=at_load, workers=workers,
        shared_models=shared, graph_capture=graph, graph_option=graph_option, gpu_wait=gpu_wait, gil_switch_ms=gil,
        queue_delay=queue_delay, streams=streams, arena_shrinkage=request.arena_shrinkage and not graph,
        decoder=decoder,
        choices=tuple(choices))


def _layout(target: Target, request: PlanRequest, host: Host, choices: list[Choice]) -> tuple[int, bool, int]:
    """(workers, shared model process, instances)."""
    if request.command == "serve" and target.is_gpu and not request.on_ray and not request.processes_given():
        workers = max(1, min(MAX_WORKERS, host.cores // CORES_PER_WORKER))
        instances = request.instances or (SERVE_GPU_INSTANCES if host.cores >= 8 else 2)
        given = " (as given)" if request.instances else " so copies and runs overlap"
        reason = (f"GPU target, {host.cores} cores: a decoding worker per {CORES_PER_WORKER} cores (at most "
                  f"{MAX_WORKERS}), one model process, {instances} instances{given}; override "
                  "with --workers, --shared-models or --instances")
        choices.append(Choice("layout", f"{workers} workers, shared model process, {instances} instances", reason))
        return workers, workers > 1, instances
    workers = request.workers or 1
    shared = bool(request.shared_models)
    if request.command == "batch" and target.is_gpu and request.instances is None:
        instances = BATCH_GPU_INSTANCES
        choices.append(Choice("instances", instances, "GPU target: one session copies its unit in while the other "
                              "runs (one per process for weights over 2 GiB)"))
    else:
        instances = request.instances or 1
        if request.command == "serve":
            choices.append(Choice("layout", f"{workers} workers{', shared model process' if shared else ''}, "
                                  f"{instances} instances", "as given" if request.layout_given() else
                                  "CPU target: one process" if not target.is_gpu else "on Ray: one replica per GPU"))
    return workers, shared, instances


def _queue_delay(target: Target, request: PlanRequest, instances: int, choices: list[Choice]) -> str | None:
    """serve's batch-forming policy (serve/batcher.py): ``fill`` where several instances of a GPU target share one
    batcher, else ``adaptive``; None for other commands."""
    if request.command != "serve":
        return None
    if request.queue_delay is not None:
        choices.append(Choice("queue_delay", request.queue_delay, "given (--queue-delay, a model's config.json, "
                              "or the server's plan for every model)"))
        return request.queue_delay
    if target.is_gpu and instances > 1 and not request.on_ray:
        choices.append(Choice("queue_delay", "fill", f"GPU target, {instances} instances: while at least twice max "
                              "batch of requests are about, a batch that is not full waits beside a running one "
                              "until it is full; with fewer, as adaptive (set --queue-delay adaptive to turn off)"))
        return "fill"
    choices.append(Choice("queue_delay", "adaptive", "a batch waits for others only while more requests are on "
                          "their way" + ("" if target.is_gpu and not request.on_ray else
                                         " (fill is measured only for several instances on a GPU)")))
    return "adaptive"


def _streams(target: Target, request: PlanRequest, instances: int, spec, choices: list[Choice]) -> str | None:
    """serve's device streams for a GPU model's instances: ``own`` (each session its provider's stream: their
    runs go side by side), ``shared`` (one stream for all: their runs queue on the device in launch order, each
    launched while the one before still runs) or ``serial`` (streams of their own, one run at a time: a lock
    around the run, each instance's copies and host work beside the others' runs; any provider); None for other
    commands, a CPU target or one instance."""
    if request.command != "serve" or not target.is_gpu or instances < 2 or request.on_ray:
        if request.streams in ("shared", "serial"):
            choices.append(Choice("streams", None, f"--streams {request.streams} dropped: it applies to several "
                                  "instances of a GPU target in one process", overrides=True))
        return None
    option = spec.stream_option if target.engine == "ort" else None
    if request.streams == "shared" and option is None:
        choices.append(Choice("streams", "own", f"--streams shared dropped: {spec.provider} takes no caller's "
                              "stream (--streams serial runs one at a time instead)", overrides=True))
        return "own"
    if request.streams == "shared" and option in target.option_dict:
        choices.append(Choice("streams", "own", f"--streams shared dropped: the target gives {option} itself",
                              overrides=True))
        return "own"
    if request.streams is not None:
        choices.append(Choice("streams", request.streams, "given (--streams or a model's config.json)"))
        return request.streams
    choices.append(Choice("streams", "own", f"each of the {instances} instances runs on a stream of its own"
                          + (" (--streams shared queues their runs on one, --streams serial runs one at a time)"
                             if option else " (--streams serial runs one at a time)")))
    return "own"


def _graph_capture(target: Target, request: PlanRequest, model: Model | None, batch_sizes: tuple[int, ...],
                   spec, choices: list[Choice]) -> tuple[Target, bool, str | None]:
    """(target with the capture option set or dropped, whether sessions capture, the option's name)."""
    option = spec.graph_option if target.engine == "ort" else None
    if option is None:
        return target, False, None
    given = target.option_dict.get(option)
    auto = request.auto_graph
    if auto is None:
        auto = request.command == "serve" and not request.processes_given() and not request.on_ray
    wanted = given == "1" or (given is None and auto and spec.graph_by_default)
    if not wanted:
        if given == "0":
            choices.append(Choice("graph_capture", False, f"{option}=0 in the target"))
        return target, False, option
    possible, why_not = _capture_possible(request, model, batch_sizes)
    if not possible:
        choices.append(Choice("graph_capture", False, f"{option} dropped: {why_not}", overrides=True))
        return target.without_options(option), False, option
    if request.arena_shrinkage:
        choices.append(Choice("arena_shrinkage", False, "not applied with graph capture (a captured graph keeps its "
                              "memory)", overrides=True))
    reason = (f"{option}=1 in the target" if given == "1" else
              f"{target.device}: the server captures by default where the model allows (set {option}=0 to turn off)")
    choices.append(Choice("graph_capture", True, reason + (f"; captured per batch size {_text(batch_sizes)}"
                                                           if batch_sizes else "")))
    return (target if given == "1" else target.with_options({option: "1"})), True, option


def _capture_possible(request: PlanRequest, model: Model | None, batch_sizes: tuple[int, ...]) -> tuple[bool, str]:
    if request.command == "serve":
        if request.max_batch is not None and request.max_batch <= 1:
            return False, "max_batch 1: served without padded sizes"
        if not request.session_per_batch_size:
            return False, "without session_per_batch_size a session sees several shapes"
        if model is not None and not fixed_shapes_but_batch(model):
            return False, ("a captured graph replays one shape; this model has no batch axis or another axis "
                           "that varies")
        return True, ""
    if request.command == "batch":
        if request.shape_buckets:
            return False, "shape buckets run several shapes per session"
        if model is not None and fixed_batch(model) is not None:
            return False, "the model's batch axis is fixed: batches are not padded"
        return True, ""
    return True, ""


def _arena(target: Target, request: PlanRequest, spec, graph: bool, choices: list[Choice]) -> Target:
    strategy_key, limit_key = spec.arena_keys
    extra = {}
    for value, key, what in ((request.arena_extend_strategy, strategy_key, "arena_strategy"),
                             (request.gpu_mem_limit, limit_key, "arena_limit")):
        if value is None:
            continue
        if key is None:
            choices.append(Choice(what, None, f"{what} has no effect on {target.device} (its provider has no such "
                                  "option)", overrides=True))
        else:
            extra[key] = str(value)
            choices.append(Choice(what, value, f"given: {key}={value}"))
    return target.with_options(extra) if extra else target


def embed_preset(target: Target, preprocess: str | None, embed: str | None = None,
                 input_kind: str | None = None) -> tuple[str | None, str]:
    """The image preset to embed in the model's graph, and why: a preset named by ``embed`` always; "none"
    never; otherwise ("auto"/None) on a GPU target when the host preprocessing is an embeddable preset (and, with
    ``input_kind``, the input holds images). Decoded pixels then travel as uint8 (a quarter of FP32's bytes) and
    the arithmetic runs on the device; CPU targets keep host preprocessing (no copy to save)."""
    mode = (embed or "auto").lower()
    if mode == "none":
        return None, "--embed-preprocess none"
    if mode != "auto":
        if mode not in EMBEDDABLE:
            from onnxaccel.errors import UsageError

            raise UsageError(f"--embed-preprocess must be one of {', '.join(EMBEDDABLE)}, auto or none, got "
                             f"'{embed}'.", "Use e.g. --embed-preprocess imagenet, or none to keep preprocessing on "
                             "the host.")
        return mode, "given"
    if preprocess is None or preprocess.lower() not in EMBEDDABLE:
        return None, "no embeddable --preprocess preset"
    if not target.is_gpu:
        return None, "CPU target: preprocessing stays on the host"
    if input_kind is not None and input_kind != "images":
        return None, f"the input holds {input_kind}, not images"
    return preprocess.lower(), "GPU target: uint8 pixels to the device, the arithmetic in the graph"


def _embed(target: Target, request: PlanRequest, choices: list[Choice]) -> str | None:
    if request.preprocess is None and request.embed_preprocess in (None, "auto", "none"):
        return None
    preset, reason = embed_preset(target, request.preprocess, request.embed_preprocess, request.input_kind)
    choices.append(Choice("embed_preprocess", preset, reason))
    return preset
