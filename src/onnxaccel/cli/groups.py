"""The precedence rule of the argument groups, their parsing helpers and the plain values they resolve to.

The rule (``pick``): an option given on the command line > the `--config` file's value > the default. An
option given replaces the configuration's value of that option as a whole (``--shape`` replaces all of the
configuration's shapes; ``--ep-option`` and ``--precision`` apply on top of whichever target won).

Typer hands a command the default when an option is not given, so "given" cannot be told from "given with
the default value" (``--target auto`` from no ``--target``). Options a configuration can set therefore
default to None in the signature and are resolved here; their help text names the visible default. None
keeps the rule in plain values: this module resolves the same from Python as from a command line.

The groups themselves (each declares its options and builds its object; cli/compose.py composes commands
from them) live beside this module:

==================  ===========================================================  ===========================
module              groups                                                       build
==================  ===========================================================  ===========================
cli/args_model.py   SourceArg (MODEL), ConfigArgs (--config), TargetArgs          str, ``TunedConfig``,
                    (--target, --precision, --ep-option), PrecisionsArgs,        ``Target``, ``Shapes``
                    ShapeArgs (--shape, --batch, --shape-buckets)
cli/args_data.py    InputArgs, RunnerArgs, PreprocessArgs, AccuracyArgs,         ``Inputs``, ``Timing``,
                    TimingArgs, ReportArgs, OutputArgs (--json)                  ``Reports``, ...
cli/args_serve.py   ServerArgs, BatcherArgs, LayoutArgs, SessionArgs, RayArgs    ``ServerConfig``, ...
==================  ===========================================================  ===========================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from onnxaccel.cli.common import resolve_target, warn
from onnxaccel.errors import InputError, UsageError
from onnxaccel.target import Target, parse_target

if TYPE_CHECKING:  # the rest is imported where it is used: building the commands needs none of it
    from onnxaccel.bench.config import TunedConfig
    from onnxaccel.bench.report import BenchReport

T = TypeVar("T")


# -- the rule and the parsing helpers -------------------------------------------------------------------

def pick(flag: T | None, configured: T | None, default: T) -> T:
    """The precedence rule of every command: the option given on the command line, else the configuration's
    value, else the default. None means "not given" (flag) and "not in the configuration" (configured)."""
    if flag is not None:
        return flag
    if configured is not None:
        return configured
    return default


def configured(tuned: TunedConfig | None, name: str) -> Any:
    """The configuration's value of ``name``, or None without a configuration."""
    return getattr(tuned, name) if tuned is not None else None


def ints(text: str, option: str) -> list[int]:
    """Positive integers from comma-separated ``text`` (duplicates dropped, order kept); UsageError names
    ``option`` otherwise."""
    values = []
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit() or int(item) < 1:
            raise UsageError(f"{option} takes positive integers, got '{item}'.", f"e.g. {option} 1,8,32")
        values.append(int(item))
    if not values:
        raise UsageError(f"{option} is empty.", f"e.g. {option} 1,8,32")
    return list(dict.fromkeys(values))


def batches(items: list[str]) -> list[int]:
    """Batch sizes from repeated and/or comma-separated ``--batch`` values, e.g. ['1,8', '32']."""
    return list(dict.fromkeys(v for item in items for v in ints(item, "--batch")))


def modes(text: str, option: str) -> list[bool]:
    """An on/off/both switch as the values to sweep: on -> [True], off -> [False], both -> [True, False]."""
    choices = {"on": [True], "off": [False], "both": [True, False]}
    value = str(text).strip().lower()
    if value not in choices:
        raise UsageError(f"{option} takes on, off or both, got '{text}'.", f"e.g. {option} both")
    return choices[value]


def floats(text: str, option: str) -> tuple[float, ...]:
    """Comma-separated numbers, e.g. an image mean 0.485,0.456,0.406."""
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"{option} must be comma-separated numbers, got '{text}'.",
                         f"e.g. {option} 0.5,0.5,0.5") from None


def check_positive(label: str, value: float | None) -> None:
    """UsageError unless ``value`` (when given) is a positive number of seconds or milliseconds."""
    if value is not None and not value > 0:
        raise UsageError(f"{label} must be positive, got {value}.", f"e.g. {label} 1")


# -- configuration --------------------------------------------------------------------------------------

def load_tuned(path: str | Path | None) -> TunedConfig | None:
    """The `tune` configuration at ``path`` (schema-checked; ConfigError with a hint), or None without one."""
    if not path:
        return None
    from onnxaccel.bench.config import load_config

    return load_config(path)


def warn_if_not_tuned(tuned: TunedConfig | None, path: str | Path) -> None:
    """Warn when the model file at ``path`` is not the one the configuration was tuned on (sha256)."""
    problem = tuned.check_model(path) if tuned is not None else None
    if problem:
        warn(problem)


# -- model and shapes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelArgs:
    """Model and shapes: the model source, its shape bindings and the batch size(s) for axis 0.

    ``batches`` is ``(None,)`` when neither a flag nor the configuration sets one (the model's own axis)."""

    source: str
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    batches: tuple[int | None, ...] = (None,)

    @property
    def batch(self) -> int | None:
        """The batch size of a command that runs one (run, batch)."""
        return self.batches[0]

    @classmethod
    def resolve(cls, model: str | None, *, shape: list[str] | None, batch: int | list[str] | None,
                tuned: TunedConfig | None) -> ModelArgs:
        """MODEL, --shape and --batch (one int, or `bench`'s list of texts) against the configuration."""
        source = resolve_source(model, tuned)
        bound = Shapes.resolve(shape, batch, tuned)
        return cls(source=source, shapes=bound.shapes, batches=bound.batches)


def resolve_source(model: str | None, tuned: TunedConfig | None) -> str:
    """MODEL, else the configuration's model; UsageError without either."""
    source = pick(model or None, configured(tuned, "model"), None)
    if not source:
        raise UsageError("No model given.", "Pass MODEL (an .onnx file or zoo:NAME), or --config FILE from `tune`.")
    return source


@dataclass(frozen=True)
class Shapes:
    """Shape bindings, the batch size(s) for axis 0 (``(None,)``: the model's own) and the shape buckets
    (canonical text, or None)."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    batches: tuple[int | None, ...] = (None,)
    buckets: str | None = None

    @property
    def batch(self) -> int | None:
        """The batch size of a command that runs one."""
        return self.batches[0]

    @classmethod
    def resolve(cls, shape: list[str] | None, batch: int | list[str] | None, tuned: TunedConfig | None,
                buckets: str | None = None) -> Shapes:
        """--shape, --batch (one int, or a list of texts) and --shape-buckets against the configuration."""
        given_shapes = None
        if shape:
            from onnxaccel.model import parse_shape_bindings  # onnx: imported only to parse a --shape

            given_shapes = parse_shape_bindings(shape)
        tuned_shapes = dict(tuned.shapes) if tuned is not None else None
        if isinstance(batch, int):
            given_batches: list[int | None] | None = [batch]
        else:
            given_batches = list(batches(batch)) if batch else None
        tuned_batch = configured(tuned, "batch")
        spec = buckets or configured(tuned, "shape_buckets")
        return cls(shapes=pick(given_shapes, tuned_shapes, {}),
                   batches=tuple(pick(given_batches, [tuned_batch] if tuned_batch is not None else None, [None])),
                   buckets=bucket_text(spec))


def bucket_text(spec: str | None) -> str | None:
    """--shape-buckets (or the configuration's) checked and in canonical form; a bad value stops here, before
    any model loads."""
    if not spec:
        return None
    from onnxaccel.engines.buckets import ShapeBuckets

    return ShapeBuckets.parse(str(spec)).describe()


# -- target ---------------------------------------------------------------------------------------------

def build_target(target: str | None, precision: str | None, ep_option: list[str] | None,
                 tuned: TunedConfig | None) -> Target:
    """--target (or the configuration's target, or auto), with --precision and --ep-option on top."""
    chosen: str | Target = pick(target, configured(tuned, "target"), "auto")
    if isinstance(chosen, Target):  # the configuration's, parsed once when it was loaded
        return parse_target(chosen, precision=precision, options=ep_option or [])
    return resolve_target(chosen, precision, ep_option)


def build_targets(targets: list[str] | None, ep_option: list[str] | None, tuned: TunedConfig | None) -> list[Target]:
    """`bench`'s repeatable --target (or the configuration's, or auto), --ep-option on each."""
    if targets:  # given: they replace the configuration's target
        return [build_target(t, None, ep_option, None) for t in targets]
    return [build_target(None, None, ep_option, tuned)]


# -- inputs ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """Inputs: the given input items (NAME=FILE, NAME=VALUE, a bare .npz), ranges and seed for the rest."""

    items: tuple[str, ...] = ()
    value_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    seed: int = 0

    @classmethod
    def resolve(cls, inputs: list[str] | None, value_range: list[str] | None = None, seed: int = 0) -> Inputs:
        """--input, --value-range and --seed (a configuration holds none of them)."""
        ranges = {}
        if value_range:
            from onnxaccel.inputs import parse_value_ranges  # onnx, numpy: imported only to parse a --value-range

            ranges = parse_value_ranges(value_range)
        return cls(items=tuple(inputs or ()), value_ranges=ranges, seed=seed)


def iobinding(flag: bool | None, tuned: TunedConfig | None) -> bool:
    """`run`'s --iobinding/--no-iobinding, else the configuration's, else on."""
    return pick(flag, configured(tuned, "iobinding"), True)


def iobinding_modes(flag: str | None, no_flag: bool, tuned: TunedConfig | None) -> list[bool]:
    """`bench`'s --iobinding on|off|both (or the hidden --no-iobinding), else the configuration's, else on."""
    given = flag if flag is not None else ("off" if no_flag else None)
    tuned_mode = configured(tuned, "iobinding")
    return modes(pick(given, None if tuned_mode is None else ("on" if tuned_mode else "off"), "on"), "--iobinding")


# -- timing ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Timing: untimed and timed runs per cell, calls per sample, concurrent requests and sessions."""

    warmup: int = 10
    runs: int | None = 100
    duration: float | None = None
    calls_per_sample: int | None = None
    concurrency: tuple[int, ...] = (1,)
    instances: tuple[int, ...] = (1,)

    @classmethod
    def resolve(cls, *, warmup: int, runs: int | None, duration: float | None, calls_per_sample: int | None,
                concurrency: str, instances: str | None, tuned: TunedConfig | None) -> Timing:
        """`bench`'s timing options, checked; --instances else the configuration's count else 1."""
        if runs is not None and duration is not None:
            raise UsageError("--runs and --duration exclude each other.", "Give one: --runs 200, or --duration 5.")
        for label, value, low in (("--warmup", warmup, 0), ("--runs", runs, 1),
                                  ("--calls-per-sample", calls_per_sample, 1)):
            if value is not None and value < low:
                raise UsageError(f"{label} must be at least {low}, got {value}.", f"e.g. {label} {max(low, 10)}")
        if duration is not None and not duration > 0:
            raise UsageError(f"--duration must be positive, got {duration}.", "e.g. --duration 5")
        tuned_instances = configured(tuned, "instances")
        counts = pick(instances, str(tuned_instances) if tuned_instances is not None else None, "1")
        return cls(warmup=warmup, runs=runs if runs is not None or duration is not None else 100, duration=duration,
                   calls_per_sample=calls_per_sample, concurrency=tuple(ints(concurrency, "--concurrency")),
                   instances=tuple(ints(counts, "--instances")))


def instance_count(flag: int | None, tuned: TunedConfig | None) -> int:
    """`serve`'s --instances, else the configuration's count, else 1."""
    return pick(flag, configured(tuned, "instances"), 1)


# -- output ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reports:
    """Output: the report files (checked before any work starts) and whether to resume from the JSON one."""

    paths: tuple[Path, ...] = ()
    resume: bool = False

    @property
    def json_path(self) -> Path | None:
        """The first JSON report: the one --resume reads."""
        return next((p for p in self.paths if p.suffix.lower() == ".json"), None)

    @classmethod
    def resolve(cls, report: list[str] | None, *, resume: bool, default_json: Path | None = None) -> Reports:
        """--report files; ``default_json`` (tune's OUTPUT.report.json) goes first when none of them is JSON."""
        given = report or ([str(default_json)] if default_json else [])
        paths = []
        if given:
            from onnxaccel.bench.report import check_report_paths  # the engines, onnx: only to check a --report

            paths = check_report_paths(given)
        if default_json is not None and not any(p.suffix.lower() == ".json" for p in paths):
            paths.insert(0, default_json)
        found = cls(tuple(paths), resume)
        if resume and found.json_path is None:
            raise UsageError("--resume needs the JSON report of the interrupted sweep.", "Add --report FILE.json (the "
                             "same file as before).")
        return found

    def previous(self) -> BenchReport | None:
        """With --resume, the report written before (None when its file does not exist yet)."""
        from onnxaccel.bench.report import load_report

        path = self.json_path
        return load_report(path) if self.resume and path is not None and path.exists() else None
