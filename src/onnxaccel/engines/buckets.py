"""Shape buckets: the few sizes a model's symbolic dims are padded up to, so a target that compiles per shape
compiles (and warms) each bucket once instead of every shape a user sends.

Compiling targets pay for every new input shape: MIGraphX compiles a program per input shape (seconds to
minutes), TensorRT builds an engine per optimization profile, and the CUDA EP searches cuDNN algorithms per
new shape. Which providers do is their ``compiles_per_shape`` (onnxaccel.providers). ``--shape-buckets
sequence=32,64,128,256`` pads a request of length 50 to 64 (at the end of the axis, with 0: the attention
mask's "no token", BERT's [PAD] id), runs the bucket's program, and crops the outputs that carry the same dim
back to 50. Image dims work the same way (``height,width=320,480,640``): padding at the bottom and right, with
the letterbox gray where a preset says so. A dim is named by its dim_param (``sequence``) or by
``INPUT:AXIS`` (``x:2,x:3=640,960``), which is friendlier where an exporter named the dims
``p2o.DynamicDimension.1``.

:class:`BucketedRunner` is a Runner over the buckets: a session per bucket on targets that compile per shape
(:func:`compiles_per_shape`), one session otherwise; every run is bucket_for -> pad -> run -> crop.

:class:`ShapeBuckets` is the value (parse, validate against a model, choose, pad, crop); the bucket batch
axis (serve's padded batch sizes) stays with :class:`onnxaccel.engines.pool.RunnerPool`.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from onnxaccel.engines.base import BoundRun, Runner
from onnxaccel.engines.bucket_outputs import output_dims, output_length
from onnxaccel.errors import InputError, ShapeError
from onnxaccel.feeds_check import FeedCheck
from onnxaccel.model import Model
from onnxaccel.target import Target


@dataclass(frozen=True)
class ShapeBuckets:
    """Bucket sizes for named symbolic dims. ``dims``: dim_param names (``("sequence",)``,
    ``("height", "width")``); ``sizes``: ascending buckets, each one value per dim."""

    dims: tuple[str, ...]
    sizes: tuple[tuple[int, ...], ...]

    @classmethod
    def parse(cls, text: str) -> ShapeBuckets:
        """``sequence=32,64,128`` or ``height,width=320,480,640`` (each bucket the same value for every dim) or
        ``height,width=320x320,480x640`` (one value per dim)."""
        names, sep, values = text.partition("=")
        dims = tuple(d.strip() for d in names.split(",") if d.strip())
        hint = ("Write --shape-buckets DIM=SIZE,SIZE,... (e.g. sequence=32,64,128,256) or DIM,DIM=SIZE,... "
                "(e.g. height,width=320,480,640 or height,width=320x320,480x640).")
        if not sep or not dims or not values.strip():
            raise ShapeError(f"--shape-buckets {text!r}: expected DIM=SIZES.", hint)
        sizes = []
        for item in values.split(","):
            item = item.strip()
            if not re.fullmatch(r"\d+(x\d+)*", item):
                raise ShapeError(f"--shape-buckets {text!r}: {item!r} is not a size.", hint)
            parts = tuple(int(p) for p in item.split("x"))
            if len(parts) == 1:
                parts = parts * len(dims)
            if len(parts) != len(dims) or min(parts) < 1:
                raise ShapeError(f"--shape-buckets {text!r}: {item!r} needs {len(dims)} positive value(s), "
                                 f"one per dim ({', '.join(dims)}).", hint)
            sizes.append(parts)
        if len(set(dims)) != len(dims):
            raise ShapeError(f"--shape-buckets {text!r} names a dim twice.", hint)
        return cls(dims, tuple(sorted(set(sizes), key=lambda s: (int(np.prod(s)), s))))

    def describe(self) -> str:
        """The text :meth:`parse` reads back, e.g. ``sequence=32,64`` or ``height,width=320x320,640x640``."""
        values = ",".join(str(s[0]) if len(set(s)) == 1 else "x".join(map(str, s)) for s in self.sizes)
        return f"{','.join(self.dims)}={values}"

    def to_dict(self) -> dict:
        """JSON-ready: the dims and each bucket's sizes."""
        return {"dims": list(self.dims), "sizes": [list(s) for s in self.sizes], "text": self.describe()}

    def label(self, bucket: Sequence[int]) -> str:
        """One bucket as text: ``sequence=64`` or ``height=320,width=480``."""
        return ",".join(f"{d}={v}" for d, v in zip(self.dims, bucket))

    # -- against a model --------------------------------------------------------------------------------

    def axes(self, model: Model) -> dict[str, list[tuple[int, str]]]:
        """Per input name, the (axis, dim) pairs that carry a bucketed dim."""
        found: dict[str, list[tuple[int, str]]] = {}
        for spec in model.inputs:
            for axis, dim in enumerate(spec.shape or ()):
                if isinstance(dim, int):
                    continue
                named = f"{spec.name}:{axis}"
                if named in self.dims:
                    found.setdefault(spec.name, []).append((axis, named))
                elif isinstance(dim, str) and dim in self.dims:
                    found.setdefault(spec.name, []).append((axis, dim))
        return found

    def aliases(self, model: Model) -> dict[str, str]:
        """Per bucketed dim named ``INPUT:AXIS``, the dim_param the model gives that axis (outputs that carry
        the same dim_param are cropped by it; :meth:`bindings_for` binds it)."""
        found = {}
        for spec in model.inputs:
            for axis, dim in enumerate(spec.shape or ()):
                if f"{spec.name}:{axis}" in self.dims and isinstance(dim, str):
                    found[f"{spec.name}:{axis}"] = dim
        return found

    def bindings_for(self, model: Model, bucket: Sequence[int]) -> dict[str, tuple[int]]:
        """:meth:`bindings` with ``INPUT:AXIS`` dims bound through the dim_param of that axis."""
        aliases = self.aliases(model)
        return {aliases.get(d, d): (int(v),) for d, v in zip(self.dims, bucket)}

    def padding_note(self, model: Model) -> str | None:
        """A note when padding can change results: bucketed axes of a rank-4 input are image height/width, and a
        convolutional model sees the padding near the border (PP-OCR det: the text mask agreed on 92 % of pixels
        of a page crop, not all). Sequence axes with an attention mask give the unpadded result. None otherwise."""
        images = sorted({name for name, pairs in self.axes(model).items() if len(model.input(name).shape or ()) == 4})
        if not images:
            return None
        return (f"shape buckets pad image input(s) {', '.join(images)} at the bottom/right: outputs can differ from an "
                "unpadded run (a convolutional model's near the padded border, one with attention along the axis "
                "anywhere; results are cropped back, not recomputed); compare with `onnxaccel compare` before relying "
                "on them")

    def validate(self, model: Model) -> None:
        """Every bucketed dim must be a symbolic dim of some input; else a ShapeError naming the model's."""
        used = {dim for pairs in self.axes(model).values() for _, dim in pairs}
        missing = [d for d in self.dims if d not in used]
        if missing:
            symbolic = sorted({d for s in model.inputs for d in (s.shape or ()) if isinstance(d, str)})
            axes = [f"{s.name}:{a}" for s in model.inputs for a, d in enumerate(s.shape or ())
                    if not isinstance(d, int)]
            raise ShapeError(
                f"--shape-buckets names {', '.join(missing)}, which no input of the model has as a symbolic dim.",
                f"The model's symbolic input dims: {', '.join(symbolic) or 'none'}; by INPUT:AXIS: "
                f"{', '.join(axes) or 'none'}.",
            )
        unnamed = [d for d in self.dims if ":" in d and d not in self.aliases(model)]
        if unnamed:
            raise ShapeError(f"--shape-buckets names {', '.join(unnamed)}: an axis the model leaves unnamed, "
                             "which cannot be bound per bucket.",
                             "Name the axis in the model (onnx.tools.update_model_dims) or bucket a named dim.")

    def actual(self, model: Model, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
        """The value of each bucketed dim in ``feeds`` (every input carrying a dim must agree)."""
        values: dict[str, int] = {}
        for name, pairs in self.axes(model).items():
            value = feeds.get(name)
            if value is None:
                continue
            for axis, dim in pairs:
                size = int(np.shape(value)[axis])
                if values.setdefault(dim, size) != size:
                    raise InputError(f"Input '{name}' has {dim}={size} on axis {axis}; another input has "
                                     f"{dim}={values[dim]}.", f"Give every input the same {dim}.")
        return values

    def choose(self, actual: Mapping[str, int]) -> tuple[int, ...] | None:
        """The smallest bucket every actual value fits in; None if none does."""
        want = [actual.get(d, 1) for d in self.dims]
        return next((b for b in self.sizes if all(v <= s for v, s in zip(want, b))), None)

    def bucket_for(self, model: Model, feeds: Mapping[str, np.ndarray]) -> tuple[tuple[int, ...], dict[str, int]]:
        """The bucket ``feeds`` run in and their actual values; an InputError naming the buckets if none fits."""
        actual = self.actual(model, feeds)
        bucket = self.choose(actual)
        if bucket is None:
            given = ", ".join(f"{d}={v}" for d, v in actual.items())
            raise InputError(f"The input ({given}) fits no shape bucket; the buckets are {self.describe()}.",
                             f"Send at most {self.label(self.sizes[-1])}, or add a larger bucket.")
        return bucket, actual

    def bindings(self, bucket: Sequence[int]) -> dict[str, tuple[int]]:
        """``Model.bind`` shapes for one bucket: ``{"sequence": (64,)}``."""
        return {d: (int(v),) for d, v in zip(self.dims, bucket)}

    def pad(self, model: Model, feeds: Mapping[str, np.ndarray], bucket: Sequence[int],
            pad_values: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
        """``feeds`` padded at the end of each bucketed axis to ``bucket`` (0, or ``pad_values[input]``); inputs
        already at the bucket's size are passed through as they are."""
        size = dict(zip(self.dims, bucket))
        axes = self.axes(model)
        out = dict(feeds)
        for name, pairs in axes.items():
            value = feeds.get(name)
            if value is None:
                continue
            widths = [(0, 0)] * np.ndim(value)
            for axis, dim in pairs:
                widths[axis] = (0, size[dim] - int(np.shape(value)[axis]))
            if any(w[1] for w in widths):
                fill = (pad_values or {}).get(name, 0)
                out[name] = np.pad(value, widths, mode="constant", constant_values=np.asarray(fill, value.dtype))
        return out

    def crop(self, model: Model, outputs: Mapping[str, np.ndarray], bucket: Sequence[int],
             actual: Mapping[str, int]) -> dict[str, np.ndarray]:
        """Outputs cut back to the sizes an unpadded run gives, along the axes that follow a bucketed dim: by the
        axis's size as a function of the input dims (:func:`output_dims`, checked against the bucket's output),
        e.g. the PP-OCR recognizer's width/8; else by the output's dim_param where the model names it, else a
        symbolic output axis whose size equals the bucket's value for a dim (in the order of ``dims``). Other
        outputs (e.g. YOLO's anchors) stay as they are (:meth:`uncropped_note` names the unknown ones)."""
        size = dict(zip(self.dims, bucket))
        specs = {s.name: s for s in model.outputs}
        named = {alias: dim for dim, alias in self.aliases(model).items()}
        out = {}
        for name, value in outputs.items():
            shape = specs[name].shape if name in specs else None
            index: list[slice] = [slice(None)] * np.ndim(value)
            left = [d for d in self.dims if d in actual]
            for axis, dim in enumerate(shape or ()):
                if axis == 0 or isinstance(dim, int):
                    continue
                length = int(np.shape(value)[axis])
                follows = self._follows(model, name, axis, length, size, actual)
                by_name = named.get(dim, dim)
                match = by_name if by_name in left else next((d for d in left if length == size[d]), None)
                if follows is not None:
                    index[axis] = slice(0, min(follows, length))
                elif match is not None and length == size[match]:
                    index[axis] = slice(0, actual[match])
                    left.remove(match)
            out[name] = value[tuple(index)] if any(s != slice(None) for s in index) else value
        return out

    def _follows(self, model: Model, output: str, axis: int, length: int, size: Mapping[str, int],
                 actual: Mapping[str, int]) -> int | None:
        """The length of ``output``'s ``axis`` at the actual sizes, where its size as a function of the input dims
        (:func:`output_dims`) gives ``length`` at the bucket's; None where there is none or it does not hold."""
        aliases = self.aliases(model)

        def at(sizes: Mapping[str, int]) -> int | None:
            bound = {**model.dim_values, **{aliases.get(d, d): int(v) for d, v in sizes.items()}}
            return output_length(model, output, axis, bound)

        return at({**size, **actual}) if at(size) == length else None

    def uncropped_note(self, model: Model) -> str | None:
        """A note naming the symbolic output axes whose size is no known function of the input dims: they come back
        at the bucket's length unless it equals a bucketed dim. None if there are none."""
        known = output_dims(model).get("outputs", {})
        unknown = [f"{spec.name}:{axis}" for spec in model.outputs for axis, dim in enumerate(spec.shape or ())
                   if axis and not isinstance(dim, int) and str(axis) not in known.get(spec.name, {})
                   and dim not in self.dims and dim not in self.aliases(model).values()]
        return (f"shape buckets: output axis {', '.join(unknown)} has no size known as a function of the input "
                "dims (ONNX Runtime's symbolic shape inference gave none): where it follows a bucketed dim without "
                "equalling it, it comes back at the bucket's length, padding included") if unknown else None


def bucket_models(model: Model, buckets: ShapeBuckets, *, batch: int | None = None,
                  shapes: Mapping[str, Sequence[int]] | None = None) -> dict[tuple[int, ...], Model]:
    """Per bucket, ``model`` bound at the bucket's sizes (and ``batch``, and ``shapes`` for the dims no bucket
    names): what a target that compiles per shape compiles once each (its compile cache then keys each bucket by
    the bound shapes)."""
    buckets.validate(model)
    return {b: model.bind({**dict(shapes or {}), **buckets.bindings_for(model, b)}, batch=batch)
            for b in buckets.sizes}


def compiles_per_shape(target: Target) -> bool:
    """Whether ``target`` pays a compile (or an algorithm search) for every new input shape: then each bucket
    gets a session of its own, compiled at its bound shapes. The native MIGraphX engine compiles a program per
    shape itself (engines/migraphx.py program_for); through ONNX Runtime it is the provider's
    ``compiles_per_shape`` (onnxaccel.providers, with the upstream source for each)."""
    # e.g. the MIGraphX EP: "Input shape mismatch detected. Recompiling" (ROCm/onnxruntime
    # migraphx_execution_provider.cc @6ac4f7666aa4, vendored in
    # tests/engines/migraphx/upstream/buckets_ep_recompile_ROCm_6ac4f76.txt; cited in providers/migraphx.py).
    return target.engine == "migraphx" or target.spec.compiles_per_shape


@dataclass
class BucketStats:
    """One bucket of a :class:`BucketedRunner`: its sizes, compile and warm-up seconds, and runs so far."""

    bucket: tuple[int, ...]
    label: str
    compile_seconds: float = 0.0
    warm_seconds: float | None = None
    runs: int = 0

    def to_dict(self) -> dict:
        """JSON-ready values."""
        return {"bucket": self.label, "sizes": list(self.bucket), "compile_seconds": self.compile_seconds,
                "warm_seconds": self.warm_seconds, "runs": self.runs}


class BucketedRunner(Runner):
    """A Runner over shape buckets: ``run(feeds)`` pads the feeds to the smallest bucket they fit, runs that
    bucket's session and crops the outputs back; feeds that fit no bucket raise an InputError naming the buckets.

    It follows the Runner template (engines/base.py): ``run`` and ``bind`` check the feeds once, with the bucket
    sessions' rules (:attr:`feed_check`), then :meth:`_run` / :meth:`_bind` hand the padded feeds to the bucket's
    session unchecked (the padding changes no name, element type or rank); ``run_unchecked`` checks nothing, and
    a run the session refuses is worded by the check as on any runner.

    ``compile`` turns a bound Model into a Runner (the pipeline's RunnerFromVariant(ConvertedModel(...)), or
    engines.compile_model). ``per_bucket`` (default :func:`compiles_per_shape`) gives each bucket a session
    compiled at its bound shapes, so a compile cache keys each bucket by those shapes; otherwise one session,
    bound at the largest bucket, runs every bucket (ONNX Runtime's CPU EP takes any size of a dynamic dim).
    ``shapes``: bindings of the dims no bucket names (``--shape``). ``pad_values``: the fill per input (default
    0: the attention mask's "no token", BERT's [PAD] id).
    The per-bucket sessions of a GPU target were written against the runtimes' documented behaviour; the MIGraphX
    paths never ran on AMD hardware.
    """

    def __init__(self, model: Model, target: Target, buckets: ShapeBuckets,
                 compile: Callable[[Model], Runner] | None = None, *, per_bucket: bool | None = None,
                 batch: int | None = None, shapes: Mapping[str, Sequence[int]] | None = None,
                 pad_values: Mapping[str, float] | None = None):
        buckets.validate(model)
        self.buckets = buckets
        self.target = target
        self.pad_values = dict(pad_values or {})
        self.per_bucket = compiles_per_shape(target) if per_bucket is None else per_bucket
        self.bound = bucket_models(model, buckets, batch=batch, shapes=shapes)
        self.model = self.bound[buckets.sizes[-1]]
        self.stats = {b: BucketStats(b, buckets.label(b)) for b in buckets.sizes}
        self.last: tuple[int, ...] | None = None
        compile = compile or compile_for(target)
        self.runners: dict[tuple[int, ...], Runner] = {}
        try:
            for bucket in buckets.sizes if self.per_bucket else (buckets.sizes[-1],):
                start = time.perf_counter()
                self.runners[bucket] = compile(self.bound[bucket])
                self.stats[bucket].compile_seconds = time.perf_counter() - start
        except BaseException:
            self.close()
            raise
        first = next(iter(self.runners.values()))
        self.placement = first.placement
        self.warnings = list(dict.fromkeys(w for r in self.runners.values() for w in r.warnings))
        self.warnings += [n for n in (buckets.padding_note(model), buckets.uncropped_note(model)) if n]
        self.compile_seconds = sum(s.compile_seconds for s in self.stats.values())

    @property
    def providers(self) -> list[str]:
        """The providers of the buckets' sessions (the same target for every bucket)."""
        return next(iter(self.runners.values())).providers

    def runner_for(self, bucket: Sequence[int]) -> Runner:
        """The session that runs ``bucket`` (its own, or the one shared session)."""
        return self.runners.get(tuple(bucket)) or self.runners[self.buckets.sizes[-1]]

    def warm_up(self, feeds: Mapping[str, np.ndarray] | None = None) -> dict[str, float]:
        """Run every bucket once (zeros at the bucket's bound shapes, or ``feeds`` padded to it where they fit)
        and record its seconds: the first run of a compiling target builds its kernels, so a request never pays
        it. Returns warm-up seconds per bucket label."""
        for bucket, model in self.bound.items():
            sample = self._sample(model, bucket, feeds)
            start = time.perf_counter()
            self.runner_for(bucket).run(sample)
            self.stats[bucket].warm_seconds = time.perf_counter() - start
        return {s.label: s.warm_seconds for s in self.stats.values()}

    def _sample(self, model: Model, bucket: tuple[int, ...], feeds: Mapping[str, np.ndarray] | None) -> dict:
        if feeds is not None:
            actual = self.buckets.actual(model, feeds)
            if all(actual.get(d, 1) <= v for d, v in zip(self.buckets.dims, bucket)):
                return self.buckets.pad(model, feeds, bucket, self.pad_values)
        return {s.name: np.zeros(model.input_shapes[s.name], dtype=s.np_dtype)
                for s in model.inputs if s.name in model.input_shapes}

    @functools.cached_property
    def feed_check(self) -> FeedCheck:
        """The feed check with the rules of the buckets' sessions (their engine's ``casts_feeds`` and
        ``checks_axes``), so a feed passes or fails here as it would on one of them alone."""
        first = next(iter(self.runners.values()))
        return FeedCheck(self.model.inputs, casts=first.casts_feeds, axes=first.checks_axes)

    def prepare(self, feeds: Mapping[str, np.ndarray]) -> tuple[tuple[int, ...], dict[str, int], dict]:
        """The bucket ``feeds`` run in, their actual sizes, and the padded feeds (not checked: the template's
        entries check them)."""
        bucket, actual = self.buckets.bucket_for(self.model, feeds)
        return bucket, actual, self.buckets.pad(self.model, feeds, bucket, self.pad_values)

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """bucket_for -> pad -> the bucket's session (unchecked: checked once by the template) -> crop."""
        bucket, actual, padded = self.prepare(feeds)
        outputs = self.runner_for(bucket).run_unchecked(padded)
        self._ran(bucket)
        return self.buckets.crop(self.model, outputs, bucket, actual)

    def _bind(self, feeds: Mapping[str, np.ndarray], **options) -> BoundRun:
        """``feeds`` padded to their bucket and bound on that bucket's session (its ``_bind``: checked once by the
        template); outputs come back cropped."""
        bucket, actual, padded = self.prepare(feeds)
        return _BucketBoundRun(self, bucket, actual, self.runner_for(bucket)._bind(padded, **options))

    def _ran(self, bucket: tuple[int, ...]) -> None:
        self.stats[bucket].runs += 1
        self.last = bucket

    def shrink_arenas(self) -> bool:
        """Shrink every bucket session's arenas; True if all could."""
        return all([r.shrink_arenas() for r in self.runners.values()])

    def close(self) -> None:
        """Close every bucket's session."""
        for runner in self.runners.values():
            runner.close()

    def describe(self) -> dict:
        """The first session's description plus the buckets: sizes, compile/warm seconds and runs per bucket,
        the one that ran last, and whether each has a session of its own."""
        found = super().describe()
        found["shape_buckets"] = {**self.buckets.to_dict(), "per_bucket_sessions": self.per_bucket,
                                  "buckets": [s.to_dict() for s in self.stats.values()],
                                  "last": self.buckets.label(self.last) if self.last else None}
        return found

    def to_dict(self) -> dict:
        """Same as :meth:`describe`."""
        return self.describe()


class _BucketBoundRun(BoundRun):
    """A bound run at one bucket: ``update`` pads new feeds to it, ``outputs`` crops back to their sizes."""

    def __init__(self, owner: BucketedRunner, bucket: tuple[int, ...], actual: dict[str, int], inner: BoundRun):
        self.owner, self.bucket, self.actual, self.inner = owner, bucket, actual, inner

    def update(self, feeds: Mapping[str, np.ndarray]) -> None:
        owner = self.owner
        bucket, actual = owner.buckets.bucket_for(owner.model, feeds)
        if bucket != self.bucket:
            raise InputError(f"These feeds fall in bucket {owner.buckets.label(bucket)}; this run is bound at "
                             f"{owner.buckets.label(self.bucket)}.", "Bind again (runner.bind) for the new bucket.")
        self.actual = actual
        self.inner.update(owner.buckets.pad(owner.model, feeds, bucket, owner.pad_values))

    def run(self) -> None:
        self.inner.run()
        self.owner._ran(self.bucket)

    def outputs(self) -> dict[str, np.ndarray]:
        return self.owner.buckets.crop(self.owner.model, self.inner.outputs(), self.bucket, self.actual)


def compile_for(target: Target, *, strict: bool = False) -> Callable[[Model], Runner]:
    """The plain compile function for ``target`` (engines.compile_model, no precision conversion)."""
    def compile(model: Model) -> Runner:
        from onnxaccel.engines import compile_model  # lazy: engines/__init__ imports the engines
        return compile_model(model, target, strict=strict)
    return compile
