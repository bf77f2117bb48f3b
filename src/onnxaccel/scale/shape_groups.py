"""Which shapes a `batch` job runs: the model's symbolic dims bound by the shapes of the files it reads.

The resolution order of docs/SHAPES.md holds here as for `run`: ``--shape`` first, then the shapes of the data
given (each .npy/.npz shard's row shape, read from its header; the row shape of a parquet shard's tensor columns,
scale/datasets.py ``_parquet_row_shape``), then the model's metadata and the batch default. Shards whose rows
bind the dims to the same sizes form one :class:`ShapeGroup`; a job runs its groups one after the other, each with
the model bound at its shapes, so rows of one shape always run together. Axes that carry a ``--shape-buckets`` dim
are left out of the grouping: their rows are padded to a bucket per unit instead.

A shard whose rows cannot take the bound shapes (``--shape`` binds a dim to another size, or two inputs of the
shard disagree on a shared dim) becomes a bad shard (stage ``scan``) with the reason, or stops the job with
``on_error="stop"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from onnxaccel.errors import InputError
from onnxaccel.model import Model
from onnxaccel.scale.datasets import BadInput, Dataset, Shard


@dataclass(frozen=True)
class ShapeGroup:
    """Shards whose rows bind the model's dims alike: the bindings a worker binds its model with (the files'
    sizes under ``--shape``), the shard indices and what ran (one entry per row shape, for the report)."""

    shapes: Mapping[str, tuple[int, ...]]
    shards: tuple[int, ...]
    ran: tuple[dict, ...] = field(default=(), compare=False)

    def describe(self) -> str:
        """One line per row shape: the input shapes that ran, padded to which bucket, how many shards and rows."""
        return "; ".join(describe_ran(entry) for entry in self.ran)


def describe_ran(entry: dict) -> str:
    """``x=8x3x48x192 (2 shards, 40 rows)``, with ``padded to x=...`` for a bucket."""
    text = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in entry["shapes"].items())
    if entry.get("padded_to"):
        text += " padded to " + ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in entry["padded_to"].items())
    return f"{text} ({entry['shards']} shard(s), {entry['rows']} rows)"


def shape_groups(model: Model, dataset: Dataset, explicit: Mapping[str, tuple[int, ...]], batch: int,
                 buckets: str | None = None, on_error: str = "skip") -> tuple[list[ShapeGroup], Dataset]:
    """The job's shape groups (module docstring) and the dataset with the shards that fit no binding marked bad.
    A ShapeError when a dim is still unbound (nothing in the data, ``--shape`` or the metadata binds it)."""
    parsed = _buckets(model, buckets)
    carried = {(name, axis) for name, pairs in (parsed.axes(model) if parsed else {}).items() for axis, _ in pairs}
    shards = list(dataset.shards)
    by_key: dict[tuple, list[int]] = {}
    for shard in dataset.shards:
        if shard.bad is not None or not shard.rows:
            continue
        try:
            bindings = file_bindings(model, shard, explicit, carried, batch)
        except InputError as exc:
            shards[shard.index] = _bad(shard, exc, on_error)
            continue
        by_key.setdefault(tuple(sorted(bindings.items())), []).append(shard.index)
    groups = []
    for key, members in by_key.items():
        shapes = {**dict(key), **explicit}
        largest = parsed.bindings_for(model, parsed.sizes[-1]) if parsed else {}
        bound = model.bind({**shapes, **largest}, batch=batch)
        kept, ran = [], {}
        for index in members:
            shard = shards[index]
            try:
                actual = _check_rows(bound, shard, carried)
            except InputError as exc:
                shards[index] = _bad(shard, exc, on_error)
                continue
            kept.append(index)
            padded = _padded(model, parsed, bound, actual, carried) if parsed else None
            entry = ran.setdefault(repr((actual, padded)), {"shapes": actual, "padded_to": padded, "shards": 0,
                                                            "rows": 0})
            entry["shards"] += 1
            entry["rows"] += shard.rows
        if kept:
            groups.append(ShapeGroup(shapes, tuple(kept), tuple(ran.values())))
    if not groups and any(s.rows for s in dataset.shards):
        first = next(s.bad for s in shards if s.bad is not None)
        raise InputError(f"No shard of --input fits the model: {first.file}: {first.reason}",
                         "Save rows that fit the model's input shapes, or bind them with --shape.")
    return groups, dataclasses.replace(dataset, shards=tuple(shards))


def file_bindings(model: Model, shard: Shard, explicit: Mapping[str, tuple[int, ...]],
                  carried: set[tuple[str, int]], batch: int) -> dict[str, tuple[int, ...]]:
    """The bindings a shard's row shapes give (``Model.bind`` keys: a named dim by its name, an unnamed axis as
    ``INPUT:AXIS``), leaving out the dims ``explicit`` binds and the bucketed axes ``carried``; an InputError
    when two inputs of the shard give a shared dim different sizes."""
    out: dict[str, tuple[int, ...]] = {}
    for name, row in shard.row_shapes:
        spec = model.input(name)
        if name in explicit or not spec.is_tensor:
            continue
        if spec.shape is None:
            out[name] = (batch, *row)
            continue
        for axis, dim in enumerate(spec.shape[1:], start=1):
            if (isinstance(dim, int) and dim > 0) or (name, axis) in carried or axis > len(row):
                continue
            key = dim if isinstance(dim, str) and dim else f"{name}:{axis}"
            if key in explicit or f"{name}:{axis}" in explicit:
                continue
            size = (int(row[axis - 1]),)
            if out.setdefault(key, size) != size:
                raise InputError(f"{shard.files[0]}: inputs share the dim '{key}' but their rows give it "
                                 f"{out[key][0]} and {size[0]}.", f"Save every input of a shard with one {key}.")
    return out


def _check_rows(bound: Model, shard: Shard, carried: set[tuple[str, int]]) -> dict[str, list[int]]:
    """The input shapes the shard's rows run at (the bound batch axis, its rows' own sizes); an InputError when a
    row does not take the bound shape outside the bucketed axes."""
    actual = {name: list(shape) for name, shape in bound.input_shapes.items()}  # images, parquet: the bound shapes
    for name, row in shard.row_shapes:
        want = bound.input_shapes.get(name)
        if want is None:
            continue
        full = [want[0], *row]
        wrong = [axis for axis, (w, got) in enumerate(zip(want, full)) if axis and (name, axis) not in carried
                 and w != got]
        if len(full) != len(want) or wrong:
            raise InputError(f"{shard.files[0]}: rows for input '{name}' have shape {list(row)}; the job binds it "
                             f"to {list(want[1:])} per row (--shape wins over the files' shapes).",
                             "Drop the --shape that binds it so that each shape runs in a group of its own, or "
                             "save rows of the bound shape.")
        actual[name] = full
    return actual


def _padded(model: Model, buckets, bound: Model, actual: dict[str, list[int]], carried) -> dict | None:
    """The input shapes the rows are padded to (the smallest bucket they fit), None when they fit none (the run
    then says so, naming the buckets)."""
    sizes = {}
    for name, pairs in buckets.axes(model).items():
        for axis, dim in pairs:
            if name in actual:
                sizes[dim] = actual[name][axis]
    bucket = buckets.choose(sizes)
    if bucket is None:
        return None
    value = dict(zip(buckets.dims, bucket))
    out = {}
    for name, shape in actual.items():
        pairs = dict(buckets.axes(model).get(name, ()))
        out[name] = [value[pairs[axis]] if axis in pairs else d for axis, d in enumerate(shape)]
    return out if out != actual else None


def _buckets(model: Model, text: str | None):
    if not text:
        return None
    from onnxaccel.engines.buckets import ShapeBuckets

    parsed = ShapeBuckets.parse(text)
    parsed.validate(model)
    return parsed


def _bad(shard: Shard, exc: InputError, on_error: str) -> Shard:
    if on_error != "skip":
        raise exc
    return dataclasses.replace(shard, rows=0, bad=BadInput(shard.files[0], exc.message, "scan"))
