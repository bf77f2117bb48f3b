"""The model repository: which models exist, their configs, their load state; load and unload them.

Layouts (a folder passed to ``serve``)::

    REPO/NAME/model.onnx            + optional REPO/NAME/config.json
    REPO/NAME/1/model.onnx          (Triton's layout; the version folder is read, only version 1 is served)
    REPO/NAME/config.json           with "source": "zoo:resnet50" (or a path) and no .onnx file
    REPO/NAME.onnx                  a bare model file, default config

A single .onnx file or zoo:NAME is a repository of one model. A model that fails to load is recorded as
UNAVAILABLE with the reason; the others load and serve regardless.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from onnxaccel.engines.buckets import BucketedRunner, ShapeBuckets, compiles_per_shape
from onnxaccel.engines.gpu_runtime import runtime_for
from onnxaccel.engines.hostmem import DeviceStream
from onnxaccel.errors import ModelError, OnnxAccelError, ShapeError, UsageError
from onnxaccel.model import ZOO_PREFIX, load_model
from onnxaccel.engines import Runner
from onnxaccel.pipeline import BoundModel, ConvertedModel, RunnerFromVariant, executed_plan, executed_warning
from onnxaccel.serve.batcher import DynamicBatcher
from onnxaccel.serve.config import ModelConfig, model_config_from, model_defaults
from onnxaccel.serve.instance import ModelInstance
from onnxaccel.serve.protocol import ProtocolError
from onnxaccel.plan import ExecutionPlan
from onnxaccel.target import Target

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"


@dataclass
class ModelEntry:
    """One model of the repository: where it comes from, its state and, when loaded, its instance and batcher."""
    name: str
    source: str
    config_file: Path | None = None
    state: str = UNAVAILABLE
    reason: str = "not loaded"
    instance: ModelInstance | None = None
    batcher: DynamicBatcher | None = None
    config: ModelConfig | None = None
    loaded_at: float | None = None
    warnings: list[str] = field(default_factory=list)

    def index_entry(self) -> dict:
        """The entry as the repository index endpoint lists it (with the reason when not ready)."""
        entry = {"name": self.name, "version": "1", "state": self.state}
        if self.state != READY:
            entry["reason"] = self.reason
        return entry


def load_instance(config: ModelConfig, progress: Callable[[str], None] = lambda step: None) -> ModelInstance:
    """Compile ``config.instances`` runners of the model, each in the thread that will run it, from one bound and
    converted model (blocking; call it in a thread). With shape buckets, every bucket is warmed here. What runs
    is the model's ExecutionPlan (config.plan), made once here and handed to the instance. ``progress`` gets each
    step as it starts (the model entry's reason while it loads: GET /v2/health/ready shows it)."""
    start = time.perf_counter()
    progress("loading: reading the model")
    source_model = load_model(config.source)
    plan = config.plan(source_model)
    model, embedding = _served_model(config, source_model, plan.embed_preprocess)
    buckets = config.buckets()
    if buckets is not None:
        buckets.validate(model)
    target = plan.target
    warnings = [f"{config.name}: {n}" for n in plan.notes] + ([embedding] if embedding else [])
    stream = None
    if plan.streams == "shared":
        stream, plan, target = _shared_stream(plan)
        if stream is None:
            warnings.append(f"{config.name}: {plan.choice('streams').reason}")
    bound = BoundModel(model, _compile_shapes(model, config.shape_bindings(), buckets) or None, batch=1)
    compile_runner = RunnerFromVariant(ConvertedModel(bound, target))
    if buckets is not None and compiles_per_shape(target):
        compile_runner = _bucketed(model, target, buckets, config.shape_bindings())

    def make() -> Runner:  # in an instance's run thread (engines.pool.RunnerPool.build)
        runner = compile_runner()
        warnings.extend(w for w in runner.warnings if w not in warnings)
        return runner

    count = max(1, config.instances)
    now = min(count, plan.instances_at_load)
    progress(f"loading: building {count} instance(s)" if now == count else
             f"loading: building {now} of {count} instance(s) ({count - now} more join after ready, one at a time)")
    try:
        instance = ModelInstance.start(config, bound(), plan, make, warnings)
    except BaseException:
        if stream is not None:
            stream.close()
        raise
    instance.stream = stream
    instance.shape_buckets = buckets
    sizes = instance.buckets
    progress(f"loading: warming {now} instance(s)" + (f" at batch size(s) {','.join(map(str, sizes))}"
                                                      if sizes else ""))
    try:
        instance.warm_up()
    except Exception as exc:  # noqa: BLE001 - a model that cannot run at a padded size serves unpadded
        if instance.graph:  # its sessions capture graphs: they cannot serve unpadded shapes
            instance.close()
            raise UsageError(f"Model '{config.name}': graph capture failed at warm-up: {exc}",
                             f"Serve it without {plan.graph_option} in the target.") from None
        instance.buckets = ()
        instance.warnings.append(f"batch padding disabled: warm-up failed ({exc})")
    if buckets is not None:
        _warm_buckets(instance, buckets)
    if isinstance(compile_runner, RunnerFromVariant):
        _label_executed(instance, config.name, executed_plan(plan, compile_runner.variant))
    instance.load_seconds = time.perf_counter() - start
    return instance


def _shared_stream(plan: ExecutionPlan) -> tuple[DeviceStream | None, ExecutionPlan, Target]:
    """The plan's ``streams: shared``: one device stream of this process for every instance of the model, the
    plan, and the target the sessions are built with (naming the stream in the provider's stream_option; the
    plan keeps the target without this process's address). Where the stream cannot be made, the instances keep
    streams of their own: (None, the plan saying so and why, the plan's target)."""
    target = plan.target
    runtime = runtime_for(target.device)
    try:
        if runtime is None:
            raise RuntimeError(f"no GPU runtime for {target.device}")
        stream = DeviceStream(runtime, target.device_id or 0)
    except RuntimeError as exc:
        return None, plan.with_override("streams", "own", "--streams shared dropped, each instance keeps a "
                                        f"stream of its own: {exc}"), target
    return stream, plan, target.with_options({target.spec.stream_option: str(stream.handle)})


def _label_executed(instance: ModelInstance, name: str, executed) -> None:
    """The precision the instance's sessions compute in, where onnxaccel converted the model on the CPU
    (pipeline.executed_plan): on the plan, and a warning where it is not all the precision asked."""
    if executed.precision_executed is None:
        return
    instance.plan = executed
    warning = executed_warning(executed)
    if warning:
        instance.warnings.append(f"{name}: {warning}")


def _served_model(config: ModelConfig, model=None, preset: str | None = None):
    """The model to serve and a note when its preprocessing was embedded (or could not be): when the plan embeds
    a preset (a GPU target, an embeddable preset, embed_preprocess auto), the cached embedded copy
    (transform/embed_preprocess.py embedded_copy, checked against host preprocessing when made), so clients'
    pixels travel as uint8 and the arithmetic runs in the graph. A model that cannot take it (no float NCHW image
    input) is served as it is."""
    if model is None:
        model = load_model(config.source)
        preset = config.plan(model).embed_preprocess
    from onnxaccel.transform.embed_preprocess import embedded_copy, embedded_of

    if preset is None or embedded_of(model.proto) is not None:
        return model, None
    try:
        path = embedded_copy(model, preset)  # the model read already: read once
    except (UsageError, ModelError) as exc:
        return model, f"{config.name}: {preset} preprocessing stays on the host: {exc.message}"
    return load_model(path), (
        f"{config.name}: GPU target: {preset} preprocessing embedded in the graph; the model takes uint8 NHWC "
        "pixels (or JPEG/PNG bytes) instead of float NCHW tensors (embed_preprocess none serves it as it is)")


def _bucketed(model, target, buckets: ShapeBuckets, given: dict) -> Callable[[], Runner]:
    """On a target that compiles per input shape (MIGraphX EP and native, TensorRT, CUDA's per-shape algorithm
    search), each runner of the pool is a BucketedRunner: a session per shape bucket, compiled at the bucket's
    sizes. Requests reach it already padded to their bucket, so it only picks the bucket's session; a session
    thus never sees a second sequence length (the MIGraphX EP would recompile on every change of bucket:
    ROCm/onnxruntime migraphx_execution_provider.cc at 6ac4f7666aa4, cited in engines/buckets.py). With the
    pool's session per padded batch size, every (batch size, bucket) pair has a session of its own."""
    others = {k: v for k, v in given.items() if k not in buckets.dims} or None

    def compile(bound_model):
        return RunnerFromVariant(ConvertedModel(bound_model, target))()

    return lambda: BucketedRunner(model, target, buckets, compile, batch=1, shapes=others)


def _warm_buckets(instance: ModelInstance, buckets: ShapeBuckets) -> None:
    """Warm every shape bucket; a bucket the model cannot run is a load failure naming it (not a 500 later)."""
    try:
        seconds = instance.warm_buckets()
    except Exception as exc:  # noqa: BLE001 - reported as the model's load failure
        instance.close()
        raise UsageError(f"Model '{instance.config.name}': a shape bucket of {buckets.describe()} failed at warm-up: "
                         f"{exc}", "Choose bucket sizes the model accepts (e.g. multiples of its stride).") from None
    note = buckets.padding_note(instance.model)
    if note:
        instance.warnings.append(f"{instance.config.name}: {note}")
    instance.warnings.append(f"{instance.config.name}: shape buckets {buckets.describe()} warmed ("
                             + ", ".join(f"{label} {s * 1e3:.0f} ms" for label, s in seconds.items()) + ")")


def _compile_shapes(model, given: dict, buckets: ShapeBuckets | None = None) -> dict:
    """Shapes to compile with: the config's, the smallest bucket for bucketed dims, and for every other
    symbolic dim the model's own default (zoo metadata) or else 1. A server takes any size on such axes per
    request; the binding only gives the compile (and the warm-up feeds) a shape."""
    shapes = dict(given)
    if buckets is not None:
        shapes.update({d: v for d, v in buckets.bindings_for(model, buckets.sizes[0]).items() if d not in shapes})
    try:
        model.bind(shapes or None, batch=1)
        return shapes
    except ShapeError:  # symbolic dims with no default: bind them to 1 (per input, full shapes)
        pass
    named = {k: v[0] for k, v in shapes.items() if k not in {s.name for s in model.inputs}}
    for spec in model.inputs:
        if spec.name in shapes or spec.shape is None:
            continue
        if any(not isinstance(d, int) for d in spec.shape[1:]):
            shapes[spec.name] = tuple(d if isinstance(d, int) else int(named.get(d, 1)) if axis else 1
                                      for axis, d in enumerate(spec.shape))
    return shapes


class ModelIndex:
    """Models by name with their states: what the protocol's endpoints look up. The models run here
    (:class:`ModelRepository`) or in a model process (serve/model_link.py ``RemoteRepository``)."""

    def __init__(self) -> None:
        self.entries: dict[str, ModelEntry] = {}

    def get(self, name: str) -> ModelEntry:
        """The entry named ``name``; a 404 ProtocolError when there is none."""
        entry = self.entries.get(name)
        if entry is None:
            known = ", ".join(sorted(self.entries)) or "none"
            raise ProtocolError(404, f"Unknown model '{name}'; this server has: {known}.")
        return entry

    def ready(self, name: str) -> ModelEntry:
        """The entry named ``name`` when ready to infer; a 503 ProtocolError giving its state otherwise."""
        entry = self.get(name)
        if entry.state != READY or entry.batcher is None:
            raise ProtocolError(503, f"Model '{name}' is {entry.state}: {entry.reason}")
        return entry

    def index(self, ready_only: bool = False) -> list[dict]:
        """Index entries of every model (only ready ones with ``ready_only``)."""
        return [e.index_entry() for e in self.entries.values() if not ready_only or e.state == READY]


class ModelRepository(ModelIndex):
    """Models by name, each with its state; ``load``/``unload`` run compiles off the event loop."""

    def __init__(self, source: str, defaults: ModelConfig | dict, *,
                 on_batch: Callable[[str], Callable[[int, float], None]] | None = None, sees_arrivals: bool = False,
                 arrivals: Callable[[str], int] | None = None):
        super().__init__()
        #: Every request reaches the batchers through this process's InferenceService, which counts the ones on
        #: their way (adaptive queue delay); False in the model process, whose requests other processes decode:
        #: there ``arrivals`` (model name -> requests its workers have taken in and not sent yet) tells instead.
        self.sees_arrivals = sees_arrivals
        self.arrivals = arrivals
        self.source = source
        self.defaults = model_defaults(defaults)
        self._on_batch = on_batch
        self._locks: dict[str, asyncio.Lock] = {}
        self.scan()

    # -- discovery -------------------------------------------------------------------------------------

    def require_models(self) -> None:
        """UsageError when the source holds no model (a server with nothing to serve should not start)."""
        if not self.entries:
            raise UsageError(f"No models found in {self.source}.", "Pass an .onnx file, zoo:NAME, or a folder of "
                             "NAME/model.onnx (see docs/SERVING.md).")

    def scan(self) -> None:
        """Find the models of the source; existing entries keep their state."""
        for name, source, config_file in discover(self.source):
            if name not in self.entries:
                self.entries[name] = ModelEntry(name, source, config_file)

    @property
    def is_folder(self) -> bool:
        """True when the source is a folder of models (not a single model)."""
        return Path(self.source).is_dir()

    # -- load / unload ---------------------------------------------------------------------------------

    async def load(self, name: str) -> ModelEntry:
        """Load (or reload) a model; failures are recorded in the entry, not raised."""
        if name not in self.entries:
            self.scan()
        entry = self.get(name)
        async with self._locks.setdefault(name, asyncio.Lock()):
            if entry.state == READY:
                await self._release(entry)
            entry.state, entry.reason = LOADING, "loading"
            try:
                config = model_config_from(name, entry.source, self.defaults, entry.config_file)
                instance = await asyncio.to_thread(load_instance, config,
                                                   lambda step, entry=entry: setattr(entry, "reason", step))
            except OnnxAccelError as exc:
                entry.state, entry.reason = UNAVAILABLE, exc.message + (f" (hint: {exc.hint})" if exc.hint else "")
                return entry
            except Exception as exc:  # noqa: BLE001 - one model's failure must not stop the server
                entry.state, entry.reason = UNAVAILABLE, f"{type(exc).__name__}: {exc}"
                return entry
            callback = self._on_batch(name) if self._on_batch else None
            entry.config, entry.instance, entry.warnings = config, instance, instance.warnings
            entry.batcher = DynamicBatcher(instance, on_batch=callback, sees_arrivals=self.sees_arrivals,
                                           arrivals=self.arrivals)
            entry.state, entry.reason, entry.loaded_at = READY, "", time.time()
        return entry

    async def unload(self, name: str) -> ModelEntry:
        """Unload a model: release its batcher and instance and mark it unavailable."""
        entry = self.get(name)
        async with self._locks.setdefault(name, asyncio.Lock()):
            await self._release(entry)
            entry.state, entry.reason = UNAVAILABLE, "unloaded"
        return entry

    async def _release(self, entry: ModelEntry) -> None:
        entry.state, entry.reason = UNLOADING, "unloading"
        batcher, instance = entry.batcher, entry.instance
        entry.batcher = entry.instance = None
        if batcher is not None:
            await batcher.close()
        if instance is not None:
            await asyncio.to_thread(instance.close)  # waits for its run threads: not on the event loop

    async def load_all(self) -> None:
        """Load every model, one after another."""
        for name in list(self.entries):
            await self.load(name)

    def flush(self) -> None:
        """Flush every model's batcher (run what is queued now)."""
        for entry in self.entries.values():
            if entry.batcher is not None:
                entry.batcher.flush()

    async def close(self) -> None:
        """Unload every ready model."""
        for entry in self.entries.values():
            if entry.state == READY:
                await self._release(entry)
                entry.state, entry.reason = UNAVAILABLE, "server stopped"


def discover(source: str) -> list[tuple[str, str, Path | None]]:
    """(name, model source, config file or None) for each model of a repository folder, file or zoo name."""
    if source.startswith(ZOO_PREFIX):
        return [(source[len(ZOO_PREFIX):], source, None)]
    root = Path(source).expanduser()
    if not root.is_dir():
        return [(root.stem, str(root), None)]
    found = []
    for child in sorted(root.iterdir()):
        if child.name.startswith("."):
            continue
        if child.is_file() and child.suffix == ".onnx":
            found.append((child.stem, str(child), None))
        elif child.is_dir():
            config = child / "config.json"
            model = _model_file(child)
            if model is not None or config.exists():
                # With no .onnx file the config must name a "source"; ModelConfig reports it if it does not.
                found.append((child.name, str(model) if model else str(child / "model.onnx"),
                              config if config.exists() else None))
    return found


def _model_file(folder: Path) -> Path | None:
    for candidate in (folder / "model.onnx", folder / "1" / "model.onnx"):
        if candidate.is_file():
            return candidate
    files = sorted(folder.glob("*.onnx"))
    return files[0] if len(files) == 1 else None
