"""Synthesized feeds: values a model accepts, at the bound shapes, for the inputs the user did not give.

Floats are uniform in [0, 1) (image-like); booleans random; integer inputs are chosen by what the graph does
with them, then by name: an op's ``axes`` input (ReduceX, Squeeze/Unsqueeze, Pad, Slice) gets distinct axes of
its data; an input that ends up as the indices of Gather / GatherElements / GatherND /
Scatter* (directly or through Cast/Reshape/Unsqueeze/Squeeze/Flatten/Identity) is drawn from [0, size of the
indexed axis) when the graph tells that size, else from the small range [0, 8); the indices of OneHot from
[0, depth); an input compared by Equal (through the same shape-only ops) with a constant holding a contiguous
run of integers lo..hi, as a one-hot spelled out (JAX's one_hot through tf2onnx) does, from [lo, hi]; otherwise
``*mask*`` gets ones and ``*type*``/``*segment*`` zeros (as onnxruntime_perf_test and
Olive do), other integers the default [0, 1000). Each description says which range was used and why.
``value_ranges`` (``--value-range NAME=LOW,HIGH``, as Polygraphy's ``--val-range``) overrides all of that.
Sequences get one element, optionals are left empty; strings and maps cannot be synthesized.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx

from onnxaccel.errors import InputError
from onnxaccel.model import Model, TensorSpec

#: Upper bound of integer draws when nothing says more (token ids of a vocabulary of at least 1000).
DEFAULT_INT_HIGH = 1000
#: Upper bound for index inputs whose indexed axis has no size the graph tells.
SMALL_INDEX_HIGH = 8

#: op type -> (index input position, data input position, how the indexed axis is chosen).
_INDEX_OPS = {
    "Gather": (1, 0, "axis"),
    "GatherElements": (1, 0, "axis"),
    "ScatterElements": (1, 0, "axis"),
    "Scatter": (1, 0, "axis"),
    "GatherND": (1, 0, "nd"),
    "ScatterND": (1, 0, "nd"),
}
#: Ops that pass an integer tensor on unchanged in value (their first input).
_PASS_THROUGH = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Tile",
                 "Transpose", "Slice", "Concat"}
#: OneHot: indices input position -> depth input position (the indices' range is [0, depth)).
_ONE_HOT = {0: 1}
#: Comparisons whose other operand, a constant holding the integers lo..hi, tells the input's range (a one-hot
#: spelled out as Equal against 0..K-1).
_RANGE_OPS = {"Equal"}
#: Largest constant read to find such a range.
_RANGE_CONSTANT_MAX = 1 << 20
#: com.microsoft EmbedLayerNormalization: ids input -> embedding table input (rows are the ids' range).
_EMBED_LAYER_NORM = {0: 2, 1: 4}
#: Ops whose ``axes`` is an input: op type -> (axes input position, data input position). The axes are distinct
#: axes of the data (Unsqueeze: of its output; Squeeze: of the data's axes of size 1).
_AXES_OPS = {op: (1, 0) for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                   "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "Squeeze",
                                   "Unsqueeze")}
_AXES_OPS.update({"Pad": (3, 0), "Slice": (3, 0)})


@dataclass(frozen=True)
class IndexBound:
    """An integer input used as indices: draw from [low, high); ``reason`` says which op and axis tell it."""

    high: int
    reason: str
    low: int = 0
    #: Draw distinct values from these (an op's axes: a repeated axis is refused), when there are enough.
    distinct: tuple[int, ...] | None = None


def synthesize(
    model: Model,
    *,
    seed: int = 0,
    value_ranges: Mapping[str, tuple[float, float]] | None = None,
    names: Iterable[str] | None = None,
) -> dict[str, object]:
    """Random feeds for the model's inputs (all, or ``names``) at their bound shapes."""
    return {k: v for k, (v, _) in synthesize_described(model, seed=seed, value_ranges=value_ranges,
                                                        names=names).items()}


def synthesize_described(
    model: Model,
    *,
    seed: int = 0,
    value_ranges: Mapping[str, tuple[float, float]] | None = None,
    names: Iterable[str] | None = None,
) -> dict[str, tuple[object, str]]:
    """Like :func:`synthesize`, with a description of how each value was drawn (for reports and errors).

    ``value_ranges`` maps an input name (or "" for every input) to (LOW, HIGH): floats uniform in
    [LOW, HIGH), integers from LOW to HIGH inclusive, as Polygraphy's ``--val-range``.
    """
    if not model.is_bound:
        model = model.bind()
    wanted = None if names is None else set(names)
    ranges = dict(value_ranges or {})
    bounds: dict[str, IndexBound] | None = None
    rng = np.random.default_rng(seed)
    out: dict[str, tuple[object, str]] = {}
    for spec in model.inputs:
        if wanted is not None and spec.name not in wanted:
            continue
        value_range = ranges.get(spec.name, ranges.get(""))
        if spec.kind == "optional":
            out[spec.name] = (None, "empty optional")
            continue
        if spec.kind == "sequence":
            shape = _element_shape(spec)
            value, how = _random_tensor(spec, shape, rng, value_range, None)
            out[spec.name] = ([value], f"one-element sequence of a {list(shape)} tensor, {how}")
            continue
        if not spec.is_tensor:
            raise InputError(
                f"Cannot synthesize input '{spec.name}' of type {spec.type_text}.",
                f"Give it with --input {spec.name}=FILE.pb (an ONNX MapProto, as onnx.numpy_helper.from_dict "
                "writes it).",
            )
        shape = model.input_shapes.get(spec.name)
        if shape is None:
            raise InputError(
                f"Input '{spec.name}' has no shape in the graph, so no value can be synthesized for it.",
                f"Give its value (--input {spec.name}=FILE.npy) or its shape (--shape {spec.name}=DIMS).",
            )
        index = None
        if value_range is None and spec.np_dtype.kind in "iuV":
            if bounds is None:
                bounds = index_bounds(model)
            index = bounds.get(spec.name)
        out[spec.name] = _random_tensor(spec, tuple(shape), rng, value_range, index)
    return out


def _element_shape(spec: TensorSpec) -> tuple[int, ...]:
    """A small shape for a sequence element: its declared fixed dims, 1 for the others, [1] if none."""
    tp = spec.type_proto.sequence_type.elem_type if spec.type_proto is not None else None
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return (1,)
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
                 for d in tp.tensor_type.shape.dim)


def _random_tensor(
    spec: TensorSpec,
    shape: tuple[int, ...],
    rng: np.random.Generator,
    value_range: tuple[float, float] | None,
    index: IndexBound | None,
) -> tuple[np.ndarray, str]:
    """A value for ``spec`` and how it was drawn; always an ndarray: numpy's draws of shape () are numpy scalars,
    which InferenceSession.run refuses ("Unable to handle object of type <class 'numpy.float32'>"), e.g. for
    Clip's 0-d min and max inputs."""
    value, how = _random_value(spec, shape, rng, value_range, index)
    return np.asarray(value), how


def _random_value(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator,
                  value_range: tuple[float, float] | None, index: IndexBound | None) -> tuple[np.ndarray, str]:
    dtype = spec.np_dtype
    name = spec.name.lower()
    if dtype.kind == "b":
        return rng.random(shape) < 0.5, "random booleans"
    integer = _int_info(dtype)
    if integer is not None:
        lo_limit, hi_limit = integer
        if value_range is not None:
            low, high = int(np.ceil(value_range[0])), int(np.floor(value_range[1]))
            how = f"integers in [{low}, {high}] (--value-range)"
            return rng.integers(low, high + 1, size=shape).astype(dtype), how
        count = int(np.prod(shape, dtype=np.int64))
        if index is not None and index.distinct is not None and count <= len(index.distinct):
            picked = rng.permutation(np.asarray(index.distinct, dtype=np.int64))[:count]
            return picked.reshape(shape).astype(dtype), f"distinct integers of {list(index.distinct)} ({index.reason})"
        if index is not None:
            low = max(index.low, lo_limit)
            high = max(low + 1, min(index.high, hi_limit + 1))
            return (rng.integers(low, high, size=shape).astype(dtype),
                    f"integers in [{low}, {high}) ({index.reason})")
        if "mask" in name:
            return np.ones(shape, dtype=dtype), "ones (a mask, by its name)"
        if "type" in name or "segment" in name:
            return np.zeros(shape, dtype=dtype), "zeros (token types, by the name)"
        high = min(DEFAULT_INT_HIGH, hi_limit + 1)
        low = max(0, lo_limit) if lo_limit >= 0 else 0
        why = ("the default range: no Gather/OneHot/Equal in the graph bounds it; "
               f"--value-range {spec.name}=LOW,HIGH sets one")
        return rng.integers(low, high, size=shape).astype(dtype), f"integers in [{low}, {high}) ({why})"
    if dtype.kind == "f" or _is_ml_float(dtype):
        low, high = value_range if value_range is not None else (0.0, 1.0)
        values = rng.random(shape, dtype=np.float32) * np.float32(high - low) + np.float32(low)
        tag = " (--value-range)" if value_range is not None else ""
        return values.astype(dtype), f"uniform in [{low:g}, {high:g}){tag}"
    raise InputError(
        f"Cannot synthesize input '{spec.name}' of type {spec.type_text}.",
        f"Give it with --input {spec.name}=FILE: a .npy of numpy strings (np.save(path, np.array(['a', 'b'])))"
        f" or a .pb; or a JSON literal, e.g. --input {spec.name}='[\"some text\"]'."
        if dtype.kind == "O" else f"Give it with --input {spec.name}=FILE.npy or FILE.pb.",
    )


def _int_info(dtype: np.dtype) -> tuple[int, int] | None:
    """(min, max) of an integer dtype, ml_dtypes' int4/uint4/int2 included; None for other dtypes."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    if dtype.kind == "V":
        try:
            info = ml_dtypes.iinfo(dtype)
        except (ValueError, TypeError):
            return None
        return int(info.min), int(info.max)
    return None


def _is_ml_float(dtype: np.dtype) -> bool:
    if dtype.kind != "V":
        return False
    try:
        ml_dtypes.finfo(dtype)
    except (ValueError, TypeError):
        return False
    return True


# -- index-aware bounds -----------------------------------------------------------------------------------

def index_bounds(model: Model) -> dict[str, IndexBound]:
    """For each integer graph input used as indices: the range [low, high) that keeps every index in bounds.

    ``low`` is 0 and ``high`` the size of the indexed axis of the data tensor when the graph tells it (an initializer, a
    Constant, a graph input with a fixed or bound dim, or onnx's shape inference), else SMALL_INDEX_HIGH; an
    input compared by Equal with a constant holding the integers lo..hi gets [lo, hi + 1). An input bounded
    several ways gets the narrowest range.
    """
    graph = model.proto.graph
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for pos, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((node, pos))
    sizes = _ShapeLookup(model)
    out: dict[str, IndexBound] = {}
    for spec in model.inputs:
        if not spec.is_tensor or _int_info(spec.np_dtype) is None:
            continue
        found: list[IndexBound] = []
        for node, pos in _index_uses(spec.name, consumers):
            bound = _bound_for(node, pos, sizes)
            if bound is not None:
                found.append(bound)
        if found:
            out[spec.name] = min(found, key=lambda b: b.high - b.low)
    return out


def _index_uses(name: str, consumers: Mapping[str, list]) -> list[tuple[onnx.NodeProto, int]]:
    """(node, input position) where ``name``, or a value passed on from it unchanged, is used as indices
    (or compared with a constant that may tell its range)."""
    uses, todo, seen = [], [name], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for node, pos in consumers.get(current, ()):
            domain = node.domain or "ai.onnx"
            if domain == "ai.onnx" and node.op_type in _INDEX_OPS and pos == _INDEX_OPS[node.op_type][0]:
                uses.append((node, pos))
            elif domain == "ai.onnx" and node.op_type == "OneHot" and pos in _ONE_HOT:
                uses.append((node, pos))
            elif domain == "com.microsoft" and node.op_type == "EmbedLayerNormalization" and pos in _EMBED_LAYER_NORM:
                uses.append((node, pos))
            elif domain == "ai.onnx" and node.op_type in _RANGE_OPS and pos in (0, 1):
                uses.append((node, pos))
            elif domain == "ai.onnx" and node.op_type in _AXES_OPS and pos == _AXES_OPS[node.op_type][0]:
                uses.append((node, pos))
            elif domain == "ai.onnx" and node.op_type in _PASS_THROUGH and (pos == 0 or node.op_type == "Concat"):
                todo.extend(o for o in node.output if o)
    return uses


def _bound_for(node: onnx.NodeProto, pos: int, sizes: _ShapeLookup) -> IndexBound | None:
    label = f"{node.op_type} '{node.name}'" if node.name else node.op_type
    if node.op_type in _RANGE_OPS:
        return _range_bound(node, pos, sizes, label)
    if node.op_type in _AXES_OPS and pos == _AXES_OPS[node.op_type][0]:
        return _axes_bound(node, pos, sizes, label)
    if node.op_type == "EmbedLayerNormalization":
        table = node.input[_EMBED_LAYER_NORM[pos]] if len(node.input) > _EMBED_LAYER_NORM[pos] else ""
        shape = sizes.shape(table) if table else None
        if shape and isinstance(shape[0], int) and shape[0] > 0:
            return IndexBound(shape[0], f"rows of '{table}' read by {label}")
        return IndexBound(SMALL_INDEX_HIGH, f"indices of {label}, whose table size is unknown")
    if node.op_type == "OneHot":
        depth = sizes.scalar(node.input[_ONE_HOT[pos]]) if len(node.input) > _ONE_HOT[pos] else None
        if depth is not None and depth > 0:
            return IndexBound(depth, f"indices of {label} of depth {depth}")
        return IndexBound(SMALL_INDEX_HIGH, f"indices of {label}, whose depth is unknown")
    _, data_pos, mode = _INDEX_OPS[node.op_type]
    data = node.input[data_pos]
    shape = sizes.shape(data)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if mode == "axis":
        axis = int(attrs.get("axis", 0))
        if shape is not None and -len(shape) <= axis < len(shape):
            dim = shape[axis]
            if isinstance(dim, int) and dim > 0 and axis % len(shape) == 0:
                return IndexBound(dim, f"indices of {label} over {dim} rows of '{data}'")
            if isinstance(dim, int) and dim > 0:
                return IndexBound(dim, f"indices of {label} into axis {axis % len(shape)} of '{data}' ({dim})")
        return IndexBound(SMALL_INDEX_HIGH, f"indices of {label}; the size of the indexed axis is unknown")
    batch_dims = int(attrs.get("batch_dims", 0))
    dims = [d for d in (shape or ())[batch_dims:]]
    if dims and all(isinstance(d, int) and d > 0 for d in dims):
        return IndexBound(min(dims), f"indices of {label} into '{data}' {list(shape)}")
    return IndexBound(SMALL_INDEX_HIGH, f"indices of {label}; the size of the indexed axes is unknown")


def _axes_bound(node: onnx.NodeProto, pos: int, sizes: _ShapeLookup, label: str) -> IndexBound | None:
    """Distinct axes of the data's rank (Unsqueeze: of the output's; Squeeze: the data's axes of size 1), when the
    graph tells the rank; else None (the default range)."""
    data = node.input[_AXES_OPS[node.op_type][1]]
    shape = sizes.shape(data) if data else None
    if shape is None:
        return None
    rank = len(shape)
    if node.op_type == "Squeeze":
        ones = tuple(i for i, d in enumerate(shape) if d == 1)
        if not ones:  # drawn from [0, rank) and refused by the op: the description says why
            return IndexBound(rank, f"axes of {label}, but '{data}' {list(shape)} has no axis of size 1 to squeeze; "
                              f"give --input {node.input[pos]}=FILE")
        return IndexBound(rank, f"axes of {label}: the axes of size 1 of '{data}' {list(shape)}", distinct=ones)
    if node.op_type == "Unsqueeze":
        axes_shape = sizes.shape(node.input[pos])
        if not axes_shape or len(axes_shape) != 1 or not isinstance(axes_shape[0], int):
            return None
        rank += axes_shape[0]
    return IndexBound(rank, f"axes of {label} over the {rank} axes of its "
                      f"{'output' if node.op_type == 'Unsqueeze' else repr(data)}", distinct=tuple(range(rank)))


def _range_bound(node: onnx.NodeProto, pos: int, sizes: _ShapeLookup, label: str) -> IndexBound | None:
    """[lo, hi + 1) when the comparison's other operand is a constant holding exactly the integers lo..hi
    (at least two of them: a comparison with one value, such as a padding check, tells no range)."""
    if len(node.input) != 2:
        return None
    other = node.input[1 - pos]
    values = sizes.values(other)
    if values is None or values.size < 2 or values.dtype.kind not in "iuf":
        return None
    if values.dtype.kind == "f" and not (np.isfinite(values).all() and (values == np.round(values)).all()):
        return None
    distinct = np.unique(values.astype(np.int64))
    lo, hi = int(distinct[0]), int(distinct[-1])
    if distinct.size < 2 or distinct.size != hi - lo + 1:
        return None
    return IndexBound(hi + 1, f"values compared by {label} with '{other}', which holds {lo}..{hi}", low=lo)


class _ShapeLookup:
    """Shapes of graph tensors: initializers, Constants, bound graph inputs, then onnx's shape inference
    (run once, lazily, only when the direct sources do not tell)."""

    def __init__(self, model: Model):
        self.model = model
        graph = model.proto.graph
        self.known: dict[str, tuple] = {t.name: tuple(t.dims) for t in graph.initializer}
        self.tensors: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for a in node.attribute:
                    if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                        self.known[node.output[0]] = tuple(a.t.dims)
                        self.tensors[node.output[0]] = a.t
                    elif a.name in ("value_int", "value_ints"):
                        value = np.asarray(onnx.helper.get_attribute_value(a), dtype=np.int64)
                        self.known[node.output[0]] = value.shape
                        self.tensors[node.output[0]] = onnx.numpy_helper.from_array(value)
        for spec in model.inputs:
            bound = model.input_shapes.get(spec.name)
            if bound is not None:
                self.known[spec.name] = tuple(bound)
            elif spec.shape is not None:
                self.known[spec.name] = spec.shape
        self.inferred: dict[str, tuple] | None = None

    def shape(self, name: str) -> tuple | None:
        if name in self.known:
            return self.known[name]
        if self.inferred is None:
            self.inferred = self._infer()
        return self.inferred.get(name)

    def scalar(self, name: str) -> int | None:
        """The value of a one-element initializer or Constant (OneHot's depth), else None."""
        tensor = self.tensors.get(name)
        if tensor is None or int(np.prod(tensor.dims, dtype=np.int64)) != 1:
            return None
        try:
            return int(onnx.numpy_helper.to_array(tensor).reshape(-1)[0])
        except (ValueError, TypeError, OverflowError):
            return None

    def values(self, name: str) -> np.ndarray | None:
        """The values of an initializer or Constant of at most _RANGE_CONSTANT_MAX elements, else None."""
        tensor = self.tensors.get(name)
        if tensor is None or int(np.prod(tensor.dims, dtype=np.int64)) > _RANGE_CONSTANT_MAX:
            return None
        try:
            return np.asarray(onnx.numpy_helper.to_array(tensor))
        except (ValueError, TypeError, OverflowError, OSError):
            return None

    def _infer(self) -> dict[str, tuple]:
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model.proto, strict_mode=False)
        except Exception:  # noqa: BLE001 - inference fails on some exotic graphs; then the range stays small
            return {}
        out = {}
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            tt = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and tt.HasField("shape"):
                out[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        return out
