"""What onnxaccel knows about one ONNX Runtime execution provider, in one frozen value.

A :class:`ProviderSpec` holds everything that differs from one provider to the next: the ORT provider name and
the distribution that brings it, the option keys a target may name and their value kinds, how each ORT
flavour spells and reads those options, graph capture, the precision switches the provider implements
itself, its arena knobs, whether it compiles per input shape, where ``best_target`` ranks it, what
``onnxaccel doctor`` checks for it, and the upstream sources all of that was read from. One module per
provider (providers/cpu.py, cuda.py, ...) holds one spec; providers/__init__.py is the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: Value kinds of an option: "bool" (normalized to 1/0), "int", "str", or a tuple of the allowed values.
OptionKind = object

#: Checks ``onnxaccel doctor`` knows how to run for a provider (ProviderSpec.doctor_checks).
#:   "gpu": warn when no GPU of the provider's vendor is found.
#:   "gfx": check each AMD GPU's architecture against what the provider has code for (system/gfx.py).
DOCTOR_CHECKS = ("gpu", "gfx")


@dataclass(frozen=True)
class Source:
    """Where a fact about another program was read: repository, path, commit (or wheel), lines."""

    repo: str
    path: str
    commit: str
    lines: str = ""

    def __str__(self) -> str:
        where = f" L{self.lines}" if self.lines else ""
        return f"{self.repo} {self.path}{where} @ {self.commit[:10]}"


@dataclass(frozen=True)
class Flavour:
    """How one family of ONNX Runtime builds parses a provider's options."""

    name: str
    title: str
    #: Option keys the parser accepts; any other key fails session creation with ``unknown_key_error``.
    keys: frozenset[str]
    true: str
    false: str
    #: Settings the provider reads only from the environment (option key -> variable, values "1"/"0").
    env_only: Mapping[str, str]
    unknown_key_error: str
    #: Whether the EP fills the ranges it hands its INT8 quantizer from its calibration-table option.
    uses_calibration_table: bool
    sources: tuple[Source, ...]
    #: How the table was checked: against a binary here, or against source only.
    checked: str

    def spell(self, value: bool) -> str:
        """A boolean in the spelling this EP build parses ("1"/"0" or "True"/"False")."""
        return self.true if value else self.false

    def to_dict(self) -> dict:
        """The parser's facts as JSON-ready values, for ``doctor`` and the target's description."""
        return {"name": self.name, "title": self.title, "keys": sorted(self.keys), "true": self.true,
                "false": self.false, "env_only": dict(self.env_only), "unknown_key_error": self.unknown_key_error,
                "uses_calibration_table": self.uses_calibration_table, "checked": self.checked,
                "sources": [str(s) for s in self.sources]}


@dataclass(frozen=True)
class Knob:
    """One stage ``onnxaccel tune`` tries for a provider: a label and the option settings it compares with the
    provider's defaults. ``graph=True`` marks the graph-capture stage, whose option is the spec's graph_option
    (it needs IO binding: a captured graph replays fixed device addresses)."""

    label: str
    settings: tuple[Mapping[str, str], ...] = ()
    graph: bool = False


@dataclass(frozen=True)
class CompileCache:
    """Where a provider keeps what it compiled, so a second session loads instead of compiling.

    ``kind`` names the cache ("ort-optimized": ONNX Runtime's optimized model, saved by onnxaccel; "migraphx",
    "tensorrt": the provider's own programs/engines). ``folder`` is the sub-folder of a cache entry the provider
    writes to, ``glob`` what it writes there, ``options`` the provider options that point it at the folder
    ("{dir}" stands for the folder's path)."""

    kind: str
    folder: str = ""
    glob: str = ""
    options: Mapping[str, str] = field(default_factory=dict)

    def options_for(self, folder: str) -> dict[str, str]:
        """The provider options that make the provider read and write ``folder``."""
        return {k: v.replace("{dir}", folder) for k, v in self.options.items()}


def _frozen(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Prewarm:
    """The tiny session that loads a provider's libraries ahead (onnxaccel.engines.prewarm)."""

    #: The target's options it takes over (the device; a layout whose kernels the real session will use).
    copied: tuple[str, ...] = ()
    #: Options of its own.
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProviderSpec:
    """One execution provider: everything a target, a session, the server and the doctor need to know."""

    #: The target's device word, e.g. "cuda" (``--target cuda:0``).
    device: str
    #: ONNX Runtime's provider name, e.g. "CUDAExecutionProvider".
    provider: str
    #: (distribution that brings the provider, onnxaccel extra that installs it).
    package: tuple[str, str]
    is_gpu: bool = True
    #: Provider-option key -> value kind (OptionKind): what a target string may name for this device.
    options: Mapping[str, OptionKind] = field(default_factory=dict)
    #: Keys a target may name that only builds newer than the tables above declare (a session passes them
    #: only where the installed build declares them).
    newer_options: Mapping[str, OptionKind] = field(default_factory=dict)
    #: The provider option that carries the target's ``:ID`` (None: the provider takes no device id).
    device_id_option: str | None = "device_id"
    #: How each ORT flavour parses the options (empty: one parser, onnxaccel's own spelling, booleans 1/0).
    flavours: tuple[Flavour, ...] = ()
    #: Option key -> ORT_* environment variable the provider reads after its options (so it wins).
    env_options: Mapping[str, str] = field(default_factory=dict)
    #: Keys that guides recommend but no ONNX Runtime build has -> why, and what to use instead.
    fake_options: Mapping[str, str] = field(default_factory=dict)
    #: The option that turns on graph capture (None: the provider has none).
    graph_option: str | None = None
    #: Whether the server turns graph capture on by default for this provider.
    graph_by_default: bool = False
    #: The option that hands the provider a caller's compute stream (its address, a decimal string); None where
    #: it takes none. serve's instances of one model may then queue their runs on one stream (plan.py streams).
    stream_option: str | None = None
    #: Precision -> the options that make the provider convert precision itself (a converted model otherwise).
    native_precision: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: How a command loads the provider's libraries ahead, with a tiny session in a background thread while it
    #: imports and reads the model (onnxaccel.engines.prewarm); None: it does not. Set where a first run was
    #: measured to spend its time loading libraries.
    prewarm: Prewarm | None = None
    #: (arena extend-strategy option, memory-limit option); None where the provider has no such option.
    arena_keys: tuple[str | None, str | None] = (None, None)
    #: Whether the provider compiles (or searches algorithms) per new input shape: a shape bucket then gets
    #: a session of its own.
    compiles_per_shape: bool = False
    #: The stages ``onnxaccel tune`` tries, in order (a GPU provider's knobs; the CPU tunes session threads).
    tuning: tuple[Knob, ...] = ()
    #: The option whose default turns TF32 on for FP32 math (None: the provider has no such switch).
    tf32_option: str | None = None
    #: Whether FP32 math runs on TF32 units by default on GPUs that have them.
    tf32_default: bool = False
    #: How the provider caches what it compiled (None: it has no cache onnxaccel can point at).
    compile_cache: CompileCache | None = None
    #: (enable INT8, calibration-table file, table in the provider's native format): the options that make the
    #: provider read an INT8 calibration table; None where it reads none.
    calibration_options: tuple[str, str, str] | None = None
    #: An example target with an option, for help texts.
    example: str = ""
    #: Rank for ``best_target`` (lower is tried first); None: never picked automatically.
    preference: int | None = None
    #: GPU vendor whose devices the provider runs on ("nvidia", "amd"; None for the CPU).
    vendor: str | None = None
    #: The doctor checks this provider when a GPU of its vendor is present, even if the wheel lacks it.
    doctor_default: bool = False
    #: Named checks the doctor runs for it (DOCTOR_CHECKS).
    doctor_checks: tuple[str, ...] = ()
    #: ONNX Runtime version that removed the provider (None while it is current), where that is recorded, and
    #: the device to use instead.
    removed_in: str | None = None
    removed_note: str = ""
    replaced_by: str | None = None
    #: Upstream text the facts above were read from ("repo path @commit/release", or a Source).
    sources: tuple[Source | str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("options", "newer_options", "env_options", "fake_options"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        object.__setattr__(self, "native_precision",
                           _frozen({p: _frozen(o) for p, o in self.native_precision.items()}))
        unknown = [c for c in self.doctor_checks if c not in DOCTOR_CHECKS]
        if unknown:
            raise ValueError(f"{self.device}: unknown doctor check(s) {unknown}; known: {DOCTOR_CHECKS}")
        named = [k for k in (self.graph_option, self.stream_option, *self.arena_keys, self.tf32_option,
                             *(self.calibration_options or ()))
                 if k is not None]
        named += [k for knob in self.tuning for setting in knob.settings for k in setting]
        named += list(self.compile_cache.options) if self.compile_cache else []
        named += [*self.prewarm.copied, *self.prewarm.options] if self.prewarm else []
        named += [k for opts in self.native_precision.values() for k in opts]
        missing = [k for k in named if k not in self.options]
        if missing:
            raise ValueError(f"{self.device}: {missing} named but not in the option table")

    def all_options(self) -> dict[str, OptionKind]:
        """Every key a target may name for this provider: the table plus the newer keys."""
        return {**self.options, **self.newer_options}

    def to_dict(self) -> dict:
        """JSON-ready summary (``onnxaccel doctor`` lists every registered provider with it)."""
        return {"device": self.device, "provider": self.provider, "package": self.package[0],
                "extra": self.package[1], "is_gpu": self.is_gpu, "options": sorted(self.options),
                "newer_options": sorted(self.newer_options), "graph_option": self.graph_option,
                "graph_by_default": self.graph_by_default, "stream_option": self.stream_option,
                "native_precision": sorted(self.native_precision),
                "compiles_per_shape": self.compiles_per_shape, "preference": self.preference,
                "vendor": self.vendor, "removed_in": self.removed_in,
                "flavours": [f.name for f in self.flavours], "sources": [str(s) for s in self.sources]}
