"""Argument groups for what runs where: the model (MODEL), the `tune` configuration (--config), the target
(--target, --precision, --ep-option) and the shapes (--shape, --batch, --shape-buckets).

:class:`TargetArgs` is the one place the command line's target text becomes a ``Target``
(``groups.build_target``, i.e. ``common.resolve_target``); its help variants are its parameters.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from onnxaccel import providers
from onnxaccel.cli.common import resolve_target
from onnxaccel.cli.compose import Built, Group, argument, option
from onnxaccel.cli.groups import Shapes, build_target, build_targets, load_tuned, resolve_source
from onnxaccel.errors import UsageError
from onnxaccel.target import Target

#: The --target help; with a --config, :class:`TargetArgs` adds the default to it.
TARGET_HELP = ("Where to run: auto, cpu, cuda[:ID], migraphx[:ID], rocm, tensorrt; optionally /PRECISION and "
               f"?KEY=VALUE (e.g. {providers.get('cuda').example}). auto = the fastest target that really loads "
               "here.")
PRECISION_HELP = "fp32, fp16 or int8 (overrides the target string)."
EP_OPTION_HELP = ("Provider or session option KEY=VALUE; repeatable. Unknown keys are rejected with the list of "
                  "valid ones.")
SHAPE = option("shape", list[str] | None, None, "--shape", "-s", help="Bind an input's shape (NAME=1x3x224x224) or "
               "a symbolic dim (sequence=128); repeatable.")
#: --batch: one size (run, compare, ...), or several to sweep (bench, tune).
BATCH = option("batch", int | None, None, "--batch", "-b", help="Batch size for every input's first axis.")
BATCHES = option("batch", list[str] | None, None, "--batch", "-b",
                 help="Batch sizes, comma-separated or repeated, e.g. 1,8,32,256.")


class SourceArg(Group):
    """MODEL: an .onnx file or zoo:NAME (``optional``: else the --config's model). Builds the text."""

    def __init__(self, help: str, *, name: str = "model", metavar: str | None = None, optional: bool = False):
        extra = {"metavar": metavar} if metavar else {}
        self.param = argument(name, str | None if optional else str, None if optional else inspect.Parameter.empty,
                              help=help, **extra)
        self.optional = optional

    def params(self):
        """The options of this group as it was made."""
        return (self.param,)

    def build(self, v: SimpleNamespace, ctx: Built) -> str:
        """The object the class docstring names, from the options' values."""
        given = getattr(v, self.param.name)
        return resolve_source(given, ctx.get(ConfigArgs)) if self.optional else given


class ConfigArgs(Group):
    """--config FILE from `tune`: the ``TunedConfig`` (schema-checked), or None. ``holds`` names what the
    command reads from it."""

    def __init__(self, holds: str):
        self.param = option("config", Path | None, None, "--config", help=f"A configuration written by `onnxaccel "
                            f"tune`: its {holds}. An option given here wins over the configuration, which wins over "
                            "the defaults.")

    def params(self):
        """The options of this group as it was made."""
        return (self.param,)

    def build(self, v: SimpleNamespace, ctx: Built):
        """The object the class docstring names, from the options' values."""
        return load_tuned(v.config)


class TargetArgs(Group):
    """--target, --precision and --ep-option; builds a ``Target``. With ``config`` the default is the
    --config's target, else auto.

    ``kind``: "one" (a ``Target``), "maybe" (None unless --target is given), "text" (the text unparsed, for
    `doctor`), "many" (repeatable: a list, for `bench`), "pair" (reference and candidate, for `compare`).
    ``help``/``precision``/``ep_option``: help texts (None: no such option)."""

    def __init__(self, *, help: str | None = None, kind: str = "one", config: bool = False,
                 precision: str | None = PRECISION_HELP, ep_option: str | None = EP_OPTION_HELP):
        self.kind, self.config = kind, config
        many = kind in ("many", "pair")
        default = "auto" if kind == "one" and not config else None
        text = help or (TARGET_HELP + (" Default: auto, or the --config's target." if config else ""))
        found = [option("target", list[str] | None if many else (str if default else str | None), default,
                        "--target", "-t", help=text)]
        if precision:
            found.append(option("precision", list[str] | None if kind == "pair" else str | None, None,
                                "--precision", "-p", help=precision))
        if ep_option:
            found.append(option("ep_option", list[str] | None, None, "--ep-option", help=ep_option))
        self._params = tuple(found)

    def params(self):
        """The options of this group as it was made."""
        return self._params

    def build(self, v: SimpleNamespace, ctx: Built) -> Any:
        """The object the class docstring names, from the options' values."""
        precision, options = getattr(v, "precision", None), getattr(v, "ep_option", None)
        tuned = ctx.get(ConfigArgs)
        if self.kind == "text":
            return v.target
        if self.kind == "maybe" and not v.target:
            return None
        if self.kind == "many":
            return build_targets(v.target, options, tuned)
        if self.kind == "pair":
            return resolve_pair(v.target or [], precision or [], options)
        return build_target(v.target, precision, options, tuned)


def resolve_pair(targets: list[str], precisions: list[str], options: list[str] | None) -> tuple[Target, Target]:
    """`compare`'s reference and candidate from the repeated --target/--precision options (see its help)."""
    if not targets:
        raise UsageError("compare needs --target (once or twice).",
                         "e.g. --target cpu --target cuda, or --target cuda --precision fp16")
    if len(targets) > 2 or len(precisions) > 2:
        raise UsageError("compare takes at most two --target and two --precision options.",
                         "Compare two at a time.")
    if len(targets) == 1 and not precisions:
        pair = [resolve_target("cpu", None, None), resolve_target(targets[0], None, options)]
    elif len(targets) == 1:
        base = resolve_target(targets[0], None, options)
        if len(precisions) == 1:
            pair = [base, resolve_target(str(base), precisions[0], None)]
        else:
            pair = [resolve_target(str(base), p, None) for p in precisions]
    else:
        # --ep-option belongs to the candidate: the reference is often the CPU, which takes no provider options.
        prec = precisions if len(precisions) == 2 else (precisions or [None]) * 2
        pair = [resolve_target(targets[0], prec[0], None), resolve_target(targets[1], prec[1], options)]
    if str(pair[0]) == str(pair[1]):
        raise UsageError(f"Both sides are '{pair[0]}'; there is nothing to compare.",
                         "Give two different targets (--target cpu --target cuda) or a --precision for the "
                         "candidate (--target cuda --precision fp16).")
    return pair[0], pair[1]


class PrecisionsArgs(Group):
    """--precision as a comma-separated list of precisions to sweep (bench) or search (tune). Builds the
    lower-cased names (empty when not given) and keeps the text."""

    def __init__(self, help: str):
        self.param = option("precision", str | None, None, "--precision", "-p", help=help)

    def params(self):
        """The options of this group as it was made."""
        return (self.param,)

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        names = tuple(p.strip().lower() for p in v.precision.split(",") if p.strip()) if v.precision else ()
        return SimpleNamespace(text=v.precision, names=names)


class ShapeArgs(Group):
    """--shape, --batch (``batch``: one of :data:`BATCH`, :data:`BATCHES` or a command's own, None for none)
    and, given its help text, --shape-buckets. Builds ``Shapes``; the --config's values fill what is not given."""

    def __init__(self, *, batch=BATCH, buckets: str | None = None):
        self._params = tuple(p for p in (SHAPE, batch) if p is not None)
        if buckets:
            self._params += (option("shape_buckets", str | None, None, "--shape-buckets", help=buckets),)

    def params(self):
        """The options of this group as it was made."""
        return self._params

    def build(self, v: SimpleNamespace, ctx: Built) -> Shapes:
        """The object the class docstring names, from the options' values."""
        return Shapes.resolve(v.shape, getattr(v, "batch", None), ctx.get(ConfigArgs),
                              getattr(v, "shape_buckets", None))
