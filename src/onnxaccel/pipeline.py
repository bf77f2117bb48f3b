"""Compose the three nouns as lazy steps: load a Model, bind its shapes, convert its precision, compile a Runner.

Every command that runs a model (run, bench, compare, profile, serve, batch) goes through these steps so that
they agree on shapes, precision handling, placement checks and warnings. Each step is a callable built from
values or from the steps before it, and does its work only when called, as Polygraphy's loaders do
(``SessionFromOnnx(model_bytes)`` takes "a serialized ONNX model ... or a callable that returns one of those" and
builds in ``call_impl``; NVIDIA/TensorRT tools/Polygraphy/polygraphy/backend/onnxrt/loader.py, commit
bb72a9312f40da23ae0eb82b6a31a35e51a34123)::

    model = ModelFromSource("model.onnx")                     # read once, on first use
    feeds = FeedsForModel(model, inputs, batch=8)             # or BoundModel(model, shapes, batch=8): no feeds
    variant = ConvertedModel(feeds.bound_model, target)       # converted once (precision.convert_for_target)
    runner = RunnerFromVariant(variant, strict=True)()        # every call compiles another runner

Unlike Polygraphy's, the model steps remember their value: the model is read, bound and converted once however
many runners (instances, a reference) are compiled from it. The target and its precision stay values from the
caller to the runner; nothing is turned into text and parsed again. :func:`prepare` (feeds included) and
:func:`compile_only` (a server's: no feeds) are the usual compositions.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from onnxaccel.engines import Runner, compile_model
from onnxaccel.errors import InferenceError
from onnxaccel.inputs import FeedOrigin, FeedSet, ImagePreprocess, prepare_feeds, synthesize
from onnxaccel.model import Model, load_model
from onnxaccel.plan import ExecutionPlan, PlanRequest, plan_execution
from onnxaccel.precision import PrecisionVariant, convert_for_target
from onnxaccel.target import Target

T = TypeVar("T")


def value_of(source: T | Callable[[], T]) -> T:
    """A step's input: the value itself, or what the step that makes it returns (Polygraphy's
    ``util.invoke_if_callable``)."""
    return source() if callable(source) else source


class Step(Generic[T]):
    """A lazy step: does its work (:meth:`make`) on the first call and returns that value on every later one.

    Thread-safe: instances built in their own threads may share one step and still load or convert once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made = False
        self._value: T | None = None

    def __call__(self) -> T:
        with self._lock:
            if not self._made:
                self._value = self.make()
                self._made = True
        return self._value  # type: ignore[return-value]

    def make(self) -> T:
        """Do the step's work; called once."""
        raise NotImplementedError


class ModelFromSource(Step[Model]):
    """The model read from a path or ``zoo:NAME`` (checked unless ``check=False``), or the Model given."""

    def __init__(self, source: str | os.PathLike | Model, *, check: bool = True) -> None:
        super().__init__()
        self.source = source
        self.check = check

    def make(self) -> Model:
        """Load the model (nothing to do for a Model)."""
        if isinstance(self.source, Model):
            return self.source
        return load_model(self.source, check=self.check)


class FeedsForModel(Step[FeedSet]):
    """The run's feeds and the model bound by them (inputs.prepare_feeds): given files and literals bind the
    symbolic dims of their inputs, ``shapes``/``batch`` the rest; inputs not given are synthesized (within
    ``value_ranges``, seeded by ``seed``)."""

    def __init__(
        self,
        model: Model | Callable[[], Model],
        inputs: Sequence[str] = (),
        *,
        shapes: Mapping[str, Sequence[int]] | None = None,
        batch: int | None = None,
        preprocess: ImagePreprocess | None = None,
        seed: int = 0,
        value_ranges: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.inputs = tuple(inputs)
        self.shapes = shapes
        self.batch = batch
        self.preprocess = preprocess
        self.seed = seed
        self.value_ranges = value_ranges

    def make(self) -> FeedSet:
        """Read, bind and synthesize the feeds."""
        return prepare_feeds(value_of(self.model), self.inputs, shapes=self.shapes, batch=self.batch,
                             preprocess=self.preprocess, seed=self.seed, value_ranges=self.value_ranges)

    def bound_model(self) -> Model:
        """The model bound by the feeds: a step of its own, for :class:`ConvertedModel`."""
        return self().model


class BoundModel(Step[Model]):
    """The model bound to ``shapes`` and ``batch`` alone (Model.bind), without feeds: what a server compiles,
    whose feeds come with each request."""

    def __init__(self, model: Model | Callable[[], Model], shapes: Mapping[str, Sequence[int]] | None = None, *,
                 batch: int | None = None) -> None:
        super().__init__()
        self.model = model
        self.shapes = shapes
        self.batch = batch

    def make(self) -> Model:
        """Bind the model's shapes."""
        return value_of(self.model).bind(self.shapes or None, batch=self.batch)


class ConvertedModel(Step[PrecisionVariant]):
    """The bound model at ``target``'s precision (precision.convert_for_target): converted once, however many
    runners are compiled from it; the variant carries the target, precision included."""

    def __init__(self, model: Model | Callable[[], Model], target: Target) -> None:
        super().__init__()
        self.model = model
        self.target = target

    def make(self) -> PrecisionVariant:
        """Convert (or not, when the provider converts itself)."""
        return convert_for_target(value_of(self.model), self.target)


class RunnerFromVariant:
    """Compiles a Runner for a variant on every call, and labels it with the variant's target.

    Not remembered, unlike the model steps: a runner is a resource (a session, device memory, a captured graph),
    one per instance and per thread; the variant it is compiled from is made once.
    """

    def __init__(self, variant: PrecisionVariant | Callable[[], PrecisionVariant], *, strict: bool = False) -> None:
        self.variant = variant
        self.strict = strict

    def __call__(self) -> Runner:
        """A new runner: from the active artifacts directory when there is one (``ONNXACCEL_ARTIFACTS`` or
        ``engines.artifacts.use``: loaded, never compiled; see :meth:`from_artifacts`), else compiled from the
        converted model. Counted either way (engines/build_counts.py)."""
        from onnxaccel.engines import artifacts, build_counts  # here: the one place this method reaches for them

        store = artifacts.active()
        if store is not None:
            return self.from_artifacts(store)
        variant = value_of(self.variant)
        runner = compile_model(variant.model, variant.engine_target, strict=self.strict)
        build_counts.count_session(variant.engine_target.engine, loaded=False)
        runner.target = variant.target  # what the user asked for (cuda/fp16): the variant already computes in it
        return runner

    def from_artifacts(self, store) -> Runner:
        """The runner ``store`` (engines/artifacts.py ArtifactStore) holds for this variant, keyed by the bound
        model before conversion and the target asked: a start from the directory converts nothing either (the
        saved artifact already has the precision). The variant itself is made only when a writable store
        (``onnxaccel compile``) lacks the artifact and makes it."""
        if isinstance(self.variant, ConvertedModel):
            model, target = value_of(self.variant.model), self.variant.target
        else:
            made = value_of(self.variant)
            model, target = made.model, made.target
        runner = store.runner(model, target, strict=self.strict, variant=lambda: value_of(self.variant))
        runner.target = target
        return runner


@dataclass
class Compiled:
    """A bound model, the target it was compiled for, its runner, and the step that compiles more of them."""

    model: Model
    target: Target
    runner: Runner
    warnings: list[str] = field(default_factory=list)
    #: Compiles another runner of the same converted model (see :meth:`new_runner`).
    compiler: Callable[[], Runner] | None = field(default=None, repr=False)
    #: What runs (plan.py): the target the runner was compiled for and why, as every command reports it.
    plan: ExecutionPlan | None = field(default=None, repr=False)

    def new_runner(self) -> Runner:
        """Another runner of the same variant (same bound, converted model and target), e.g. a further
        instance: nothing is loaded, bound or converted again."""
        if self.compiler is None:
            return RunnerFromVariant(ConvertedModel(self.model, self.target))()
        return self.compiler()

    def close(self) -> None:
        """Release the runner (its session and device memory)."""
        self.runner.close()


@dataclass
class Prepared(Compiled):
    """A compiled model with the feeds of this run (files, literals, synthesized) and where each came from."""

    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    #: Where each input's value came from (file, literal, image, synthesized and how).
    origins: list[FeedOrigin] = field(default_factory=list)

    @property
    def synthesized(self) -> list[FeedOrigin]:
        """The inputs whose values were drawn, not given."""
        return [o for o in self.origins if o.synthesized]

    def run(self, *, iobinding: bool = False) -> dict:
        """Run once on the prepared feeds; a failure names the synthesized inputs (see explain_failure)."""
        try:
            if iobinding:
                bound = self.runner.bind(self.feeds)
                bound.run()
                return bound.outputs()
            return self.runner.run(self.feeds)
        except InferenceError as exc:
            raise explain_failure(exc, self.origins) from exc.__cause__

    def for_target(self, target: Target, *, strict: bool = False) -> Prepared:
        """The same bound model and feeds compiled for another ``target`` (a comparison's reference): nothing is
        loaded, bound or drawn again, so both sides run the very same inputs."""
        plan = plan_execution(target, PlanRequest(command=self.plan.command if self.plan else "run"), model=self.model)
        compiler = RunnerFromVariant(ConvertedModel(self.model, plan.target), strict=strict)
        runner = compiler()
        plan = honest_plan(plan, runner, self.feeds)
        return Prepared(self.model, target, runner, _warnings(runner), compiler, plan, self.feeds, self.origins)


def explain_failure(exc: InferenceError, origins: Sequence[FeedOrigin]) -> InferenceError:
    """The same error, its hint saying which inputs were synthesized (shape, type, how drawn) and how to give
    real ones, when any were; else ``exc`` unchanged. Every command that runs synthesized feeds uses it."""
    synthesized = [o for o in origins if o.synthesized]
    if not synthesized or getattr(exc, "explained", False):
        return exc
    listed = "; ".join(o.describe().replace(", synthesized (", " drawn as (") for o in synthesized)
    hint = (f"The run used synthesized values for {len(synthesized)} input(s): {listed}. Random values can be "
            "out of range for the model (indices, lengths, ids): give real ones with --input NAME=FILE "
            "(.npy/.npz/.pb) or NAME=VALUE, or bound them with --value-range NAME=LOW,HIGH.")
    if exc.hint:
        hint += f" Otherwise: {exc.hint}"
    explained = type(exc)(exc.message, hint, details=exc.details)
    explained.explained = True
    return explained


def prepare(
    source: str | Model,
    target: Target,
    *,
    inputs: Sequence[str] = (),
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    strict: bool = False,
    preprocess: ImagePreprocess | None = None,
    seed: int = 0,
    check: bool = True,
    value_ranges: Mapping[str, tuple[float, float]] | None = None,
    command: str = "run",
) -> Prepared:
    """Load (unless given a Model), bind shapes from --shape/--batch/input files, plan (plan.py), convert
    precision when the provider cannot, and compile. Feeds not given (files, literals) are synthesized, within
    ``value_ranges`` where given (input name, or "" for all -> (LOW, HIGH)). ``command`` names who asks (run,
    bench, compare...), for the plan."""
    feeds = FeedsForModel(ModelFromSource(source, check=check), inputs, shapes=shapes, batch=batch,
                          preprocess=preprocess, seed=seed, value_ranges=value_ranges)
    feed_set = feeds()
    plan = plan_execution(target, PlanRequest(command=command, batch=batch, shapes=dict(shapes or {})),
                          model=feed_set.model)
    compiler = RunnerFromVariant(ConvertedModel(feeds.bound_model, plan.target), strict=strict)
    runner = compiler()
    plan = honest_plan(plan, runner, feed_set.feeds)
    return Prepared(feed_set.model, target, runner, _warnings(runner), compiler, plan, feed_set.feeds,
                    feed_set.origins)


def compile_only(
    source: str | Model,
    target: Target,
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    strict: bool = False,
    check: bool = True,
) -> Compiled:
    """Load (unless given a Model), bind ``shapes``/``batch``, convert precision when the provider cannot, and
    compile, without feeds: for a caller whose data comes later (a server). Inputs no feed could be drawn for
    (strings) do not stop it."""
    bound = BoundModel(ModelFromSource(source, check=check), shapes, batch=batch)
    plan = plan_execution(target, PlanRequest(command="run", batch=batch, shapes=dict(shapes or {})), model=bound())
    compiler = RunnerFromVariant(ConvertedModel(bound, plan.target), strict=strict)
    runner = compiler()
    plan = honest_plan(plan, runner, None)
    return Compiled(bound(), target, runner, _warnings(runner), compiler, plan)


def honest_plan(plan: ExecutionPlan, runner: Runner, feeds: Mapping[str, np.ndarray] | None) -> ExecutionPlan:
    """``plan`` with the precision ``runner``'s session computed in (precision/executed.py), where onnxaccel
    converted the model (fp16, int8 not left to the provider): the label every command shows then says what ran.
    ``feeds`` (None: synthesized for the bound model) drive the one profiled run."""
    if not _profiled(plan):
        return plan
    from onnxaccel.precision.executed import executed_precision  # ORT profiling: only for converted models

    path = getattr(getattr(runner, "model", None), "path", None)
    key = _executed_key(plan)
    known = _executed_known(plan, path)
    if known:
        return plan.with_executed(known)
    if feeds is None:
        try:
            feeds = synthesize(runner.model)
        except Exception:  # noqa: BLE001 - inputs no feed can be drawn for (strings): the label stays as asked
            return plan
    executed = executed_precision(runner, feeds, plan.precision)
    if executed is not None and path:
        from onnxaccel import model_memo

        model_memo.remember(Path(path), **{key: executed.to_dict()})
    return plan.with_executed(executed.to_dict() if executed is not None else None)


def executed_plan(plan: ExecutionPlan, variant: PrecisionVariant | Callable[[], PrecisionVariant]) -> ExecutionPlan:
    """:func:`honest_plan` for commands whose runners are built elsewhere (serve's instances, each in its thread;
    batch's workers, in pipelines or Ray actors): from the variant they compile (``ConvertedModel``; the converted
    file is cached, so this is theirs), known from an earlier run of the same file or profiled in one more session
    here, closed after. The CPU only, as honest_plan."""
    from onnxaccel.engines import artifacts

    if not _profiled(plan) or artifacts.active() is not None:
        return plan  # a start from an artifacts directory converts nothing (RunnerFromVariant.from_artifacts)
    try:
        variant = value_of(variant)
        known = _executed_known(plan, variant.model.path)
        if known:
            return plan.with_executed(known)
        runner = compile_model(variant.model, variant.engine_target)
    except Exception:  # noqa: BLE001 - the label is a report detail: the command's own runners already built
        return plan
    try:
        return honest_plan(plan, runner, None)
    finally:
        runner.close()


def executed_warning(plan: ExecutionPlan) -> str | None:
    """The warning serve and batch print where the profiled precision (:func:`executed_plan`) is not all the
    precision asked; None where it is, or where nothing was profiled."""
    label = (plan.precision_executed or {}).get("label")
    if not label or label == plan.precision:
        return None
    return (f"precision as executed: {label} (ONNX Runtime computes the nodes it has no {plan.precision} kernel "
            "for in float32, between casts)")


def _profiled(plan: ExecutionPlan) -> bool:
    # Only the CPU provider is profiled: it lacks most float16 kernels and ONNX Runtime casts around them.
    # A GPU provider has them; a second session there would cost its start-up (a GPU session, a search).
    return plan.precision != "fp32" and not plan.precision_native and plan.target.device == "cpu"


def _executed_key(plan: ExecutionPlan) -> str:
    from onnxaccel.engines.ort import import_ort

    return f"executed_precision:{plan.target.device}:{plan.precision}:{import_ort().__version__}"


def _executed_known(plan: ExecutionPlan, path) -> dict | None:
    """The label profiled earlier for this converted file (model_memo: kept while the file is unchanged)."""
    if not path:
        return None
    from onnxaccel import model_memo

    return model_memo.facts(Path(path)).get(_executed_key(plan))


def _warnings(runner: Runner) -> list[str]:
    """The runner's warnings, each once, in order."""
    return list(dict.fromkeys(runner.warnings))
