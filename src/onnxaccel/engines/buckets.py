"""Shape buckets: the few sizes a model's symbolic dims are padded up to, so a target that compiles per shape
compiles (and warms) each bucket once instead of every shape a user sends.

Compiling targets pay for every new input shape: MIGraphX compiles a program per input shape (seconds to
minutes), TensorRT builds an engine per optimization profile, and the CUDA EP searches cuDNN algorithms per
new shape (measured in serve on an H200: ~220 ms a run for each new batch size). ``--shape-buckets
sequence=32,64,128,256`` pads a request of length 50 to 64 (at the end of the axis, with 0: the attention
mask's "no token", BERT's [PAD] id), runs the bucket's program, and crops the outputs that carry the same dim
back to 50. Image dims work the same way (``height,width=320,480,640``): padding at the bottom and right, with
the letterbox gray where a preset says so.

:class:`ShapeBuckets` is the value (parse, validate against a model, choose, pad, crop); the bucket batch
axis (serve's padded batch sizes) stays with :class:`onnxaccel.engines.pool.RunnerPool`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from onnxaccel.errors import InputError, ShapeError
from onnxaccel.model import Model


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
                if isinstance(dim, str) and dim in self.dims:
                    found.setdefault(spec.name, []).append((axis, dim))
        return found

    def validate(self, model: Model) -> None:
        """Every bucketed dim must be a symbolic dim of some input; else a ShapeError naming the model's."""
        used = {dim for pairs in self.axes(model).values() for _, dim in pairs}
        missing = [d for d in self.dims if d not in used]
        if missing:
            symbolic = sorted({d for s in model.inputs for d in (s.shape or ()) if isinstance(d, str)})
            raise ShapeError(
                f"--shape-buckets names {', '.join(missing)}, which no input of the model has as a symbolic dim.",
                f"The model's symbolic input dims: {', '.join(symbolic) or 'none'}.",
            )

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
        """Outputs cut back to the actual sizes along the axes that carry a bucketed dim: by the output's
        dim_param where the model names it, else a symbolic output axis whose size equals the bucket's value
        for a dim (in the order of ``dims``). Other outputs (e.g. YOLO's anchors) stay as they are."""
        size = dict(zip(self.dims, bucket))
        specs = {s.name: s for s in model.outputs}
        out = {}
        for name, value in outputs.items():
            shape = specs[name].shape if name in specs else None
            index: list[slice] = [slice(None)] * np.ndim(value)
            left = [d for d in self.dims if d in actual]
            for axis, dim in enumerate(shape or ()):
                if axis == 0 or isinstance(dim, int):
                    continue
                length = int(np.shape(value)[axis])
                match = dim if dim in left else next((d for d in left if length == size[d]), None)
                if match is not None and length == size[match]:
                    index[axis] = slice(0, actual[match])
                    left.remove(match)
            out[name] = value[tuple(index)] if any(s != slice(None) for s in index) else value
        return out


def bucket_models(model: Model, buckets: ShapeBuckets, *, batch: int | None = None) -> dict[tuple[int, ...], Model]:
    """Per bucket, ``model`` bound at the bucket's sizes (and ``batch``): what a target that compiles per shape
    compiles once each (its compile cache then keys each bucket by the bound shapes)."""
    buckets.validate(model)
    return {b: model.bind(buckets.bindings(b), batch=batch) for b in buckets.sizes}
