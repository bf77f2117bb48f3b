"""Binding a model's symbolic input dimensions to sizes (``Model.bind``), with errors that name the dim.

One resolution order, the same for every command (docs/SHAPES.md, "Resolution order"):

1. ``--shape`` (an input's full shape, ``DIM=VALUE`` for a named dim, or ``INPUT:AXIS=VALUE`` for one axis of
   one input, named or not), and ``--batch`` for axis 0;
2. the shapes of the inputs the user gave (arrays, files, preprocessed images, eval data): callers pass them
   in ``shapes`` as full input shapes, under the explicit ``--shape`` entries;
3. the model's metadata: ``onnxaccel.dim_defaults`` (the zoo) and Ultralytics' ``imgsz`` (the export size,
   for the height/width of the image input);
4. 1 for a leading (axis 0) batch-like dim, with a note;
5. else a ShapeError naming every unbound dim (input, axis, name) with a complete command line that binds
   them at example values.

``inspect`` without a target binds what is left at example values instead (:func:`bind_examples`), and says so.
Split from model.py; it works on a Model's inputs and metadata only and returns a ``dataclasses.replace``d copy.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnxaccel.errors import ShapeError

if TYPE_CHECKING:
    from onnxaccel.model import Model, TensorSpec

#: Model metadata key holding JSON defaults for symbolic dims, e.g. {"sequence": 128} (set by the zoo).
DIM_DEFAULTS_KEY = "onnxaccel.dim_defaults"
#: Ultralytics export metadata (ultralytics/engine/exporter.py writes ``imgsz`` as "[H, W]" and ``task``;
#: dynamic exports name the image axes {0: 'batch', 2: 'height', 3: 'width'}).
ULTRALYTICS_IMGSZ_KEY = "imgsz"
#: Example sizes for dims nothing binds (inspect without shapes, and the command line in the error).
EXAMPLE_IMAGE_SIZE = 640
EXAMPLE_OTHER_SIZE = 128


@dataclass(frozen=True)
class UnboundDim:
    """A symbolic input dim that nothing bound: where it is, its name if it has one, and an example value."""
    input: str
    axis: int
    name: str | None
    example: int

    @property
    def label(self) -> str:
        """The name a formula or a binding uses: a readable dim_param, else ``input[axis]``."""
        return dim_label(self.input, self.axis, self.name)

    def describe(self) -> str:
        """``input 'x' axis 2 ('height')`` / ``input 'x' axis 2 (unnamed)``."""
        return f"input '{self.input}' axis {self.axis} ({repr(self.name) if self.name else 'unnamed'})"

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"input": self.input, "axis": self.axis, "name": self.name, "label": self.label,
                "example": self.example}


@dataclass
class _Resolution:
    explicit: dict[str, tuple[int, ...]]
    dim_values: dict[str, int]
    #: (input, axis) -> size from ``INPUT:AXIS=VALUE`` bindings.
    axis_values: dict[tuple[str, int], int]
    resolved: dict[str, tuple[int, ...]]
    notes: list[str]
    unbound: list[UnboundDim]


def bind_shapes(model: Model, shapes: dict[str, tuple[int, ...]], batch: int | None) -> Model:
    """``Model.bind``: a copy of ``model`` whose every tensor input has a concrete shape (the module docstring
    gives the order); a ShapeError naming each unbound dim and a command that binds it otherwise."""
    res = _resolve(model, shapes, batch, examples=None)
    if res.unbound:
        raise unbound_error(model, res.unbound, shapes, res.resolved)
    return _bound(model, res)


def bind_examples(model: Model, shapes: Mapping[str, tuple[int, ...]] | None = None, batch: int | None = None,
                  examples: Mapping[str, int] | None = None) -> tuple[Model, list[UnboundDim]]:
    """Bind like :func:`bind_shapes`, but give the dims nothing binds example values instead of failing.

    ``examples`` overrides the example value per :attr:`UnboundDim.label`. Returns the bound model and the
    dims that took example values (empty when the model was fully bound by the resolution order).
    """
    first = _resolve(model, dict(shapes or {}), batch, examples=None)
    if not first.unbound:
        return _bound(model, first), []
    chosen = {d.label: (examples or {}).get(d.label, d.example) for d in first.unbound}
    res = _resolve(model, dict(shapes or {}), batch, examples=chosen)
    used = [dataclasses.replace(d, example=chosen[d.label]) for d in first.unbound]
    res.notes.append("at " + ", ".join(f"{d.label}={d.example}" for d in _unique(used))
                     + " (example values; bind with --shape)")
    return _bound(model, res), used


def unbound_error(model: Model, unbound: list[UnboundDim], shapes: Mapping[str, tuple[int, ...]],
                  resolved: Mapping[str, tuple[int, ...]] | None = None) -> ShapeError:
    """The error for dims left unbound: each one named, and a complete command line binding them
    (``resolved``: the sizes the other dims did get, for full-shape bindings)."""
    args = binding_args(model, unbound, shapes, resolved)
    return ShapeError(
        "Symbolic dimensions left unbound: " + "; ".join(d.describe() for d in unbound) + ".",
        f"Bind them, e.g. (example values): {_command()} {model.source} {' '.join(args)}\n"
        "--shape INPUT=DIMS gives an input's full shape, --shape DIM=VALUE binds a named dim wherever it "
        "appears, --batch N the batch axis.",
    )


def binding_args(model: Model, unbound: list[UnboundDim], shapes: Mapping[str, tuple[int, ...]],
                 resolved: Mapping[str, tuple[int, ...]] | None = None) -> list[str]:
    """``--shape`` arguments that bind ``unbound`` at their example values (and keep the given ``shapes``):
    ``--shape DIM=V`` when every unbound dim of an input is named readably, else the input's full shape (its
    other dims as ``resolved`` has them)."""
    args = [f"--shape {k}={'x'.join(map(str, v))}" for k, v in shapes.items()]
    by_input: dict[str, list[UnboundDim]] = {}
    for d in unbound:
        by_input.setdefault(d.input, []).append(d)
    named: dict[str, int] = {}
    for name, dims in by_input.items():
        if all(d.name and _readable(d.name) for d in dims):
            named.update({d.name: d.example for d in dims if d.name})
            continue
        spec = model.input(name)
        values = {d.axis: d.example for d in dims}
        known = (resolved or {}).get(name, ())
        full = [values[i] if i in values else known[i] if i < len(known) and known[i] else
                d if isinstance(d, int) else 1 for i, d in enumerate(spec.shape or ())]
        args.append(f"--shape {name}={'x'.join(map(str, full))}")
    args.extend(f"--shape {k}={v}" for k, v in named.items())
    return list(dict.fromkeys(args))


def dim_label(input_name: str, axis: int, name: str | None) -> str:
    """How formulas and example values name a dim: its dim_param when readable, else ``input[axis]``."""
    return name if name and _readable(name) else f"{input_name}[{axis}]"


def _readable(name: str) -> bool:
    """A dim name a person would type (``height``, ``sequence``), not an exporter's generated one
    (``p2o.DynamicDimension.0``, ``unk__12``, ``dim_3``): those are bound through the input's full shape."""
    return bool(re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name)) and not re.match(r"(unk__|dim_?\d|DynamicDim)", name)


def _command() -> str:
    """``onnxaccel COMMAND`` for the CLI command running now, else ``onnxaccel run``.

    The command's name comes from the click context of the running CLI (typer vendors click as
    ``typer._click``); only modules already loaded are consulted, so library use imports no CLI code.
    """
    for module in ("typer._click.globals", "click.globals"):
        globals_ = sys.modules.get(module)
        ctx = getattr(globals_, "get_current_context", lambda silent: None)(silent=True) if globals_ else None
        if ctx is not None and getattr(ctx, "info_name", None):
            return f"onnxaccel {ctx.info_name}"
    return "onnxaccel run"


def _resolve(model: Model, shapes: dict[str, tuple[int, ...]], batch: int | None,
             examples: Mapping[str, int] | None) -> _Resolution:
    explicit, dim_values, axis_values = _split_bindings(model, shapes)
    if batch is not None and batch < 1:
        raise ShapeError(f"--batch must be at least 1, got {batch}.", "Pass --batch 1 or more.")
    for spec in model.inputs:
        if spec.name in explicit:
            _check_explicit(spec, explicit[spec.name], dim_values)

    notes = list(model.notes)
    defaults = _metadata_dim_defaults(model)
    image_defaults = _ultralytics_image_size(model)
    res = _Resolution(explicit, dim_values, axis_values, {}, notes, [])
    for spec in model.inputs:
        if spec.name in explicit:
            res.resolved[spec.name] = explicit[spec.name]
            continue
        if not spec.is_tensor:
            continue
        if spec.shape is None:
            notes.append(f"input '{spec.name}' has no shape in the graph: give its value (--input) or its "
                         f"shape (--shape {spec.name}=DIMS)")
            continue
        dims: list[int] = []
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, int) and dim > 0:
                dims.append(dim)
                continue
            if _declared_empty(spec, axis):
                given = res.axis_values.get((spec.name, axis))
                if given not in (None, 0):
                    raise _empty_axis_bound(spec, axis, given, f"Drop --shape {spec.name}:{axis}={given}")
                dims.append(0)
                continue
            value = _default_for(spec, axis, dim, res, batch, defaults, image_defaults, examples)
            if value is None:
                res.unbound.append(UnboundDim(spec.name, axis, dim if isinstance(dim, str) else None,
                                              example_value(spec, axis, dim)))
                dims.append(0)
                continue
            if isinstance(dim, str):
                _set_dim(dim_values, dim, value, spec.name)
            dims.append(value)
        res.resolved[spec.name] = tuple(dims)
    return res


def _declared_empty(spec: TensorSpec, axis: int) -> bool:
    """The input declares ``dim_value: 0`` on ``axis`` (e.g. an empty `axes` input of ReduceSum in ONNX's own
    test cases). model._dim reads 0 as unknown, as exporters write it on outputs, but ONNX Runtime holds a graph
    input to it: any other size fails "Got invalid dimensions for input"."""
    tp = spec.type_proto
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return False
    dims = tp.tensor_type.shape.dim
    return axis < len(dims) and dims[axis].HasField("dim_value") and dims[axis].dim_value == 0


def _empty_axis_bound(spec: TensorSpec, axis: int, given: int, fix: str) -> ShapeError:
    return ShapeError(f"Input '{spec.name}' axis {axis} is declared with size 0 (dim_value 0), which ONNX Runtime "
                      f"holds the input to; the binding gives {given}.",
                      f"{fix}, or re-export the model with that axis dynamic.")


def _default_for(spec: TensorSpec, axis: int, dim, res: _Resolution, batch: int | None, defaults: dict[str, int],
                 image_defaults: dict[int, int], examples: Mapping[str, int] | None) -> int | None:
    """Steps 1-4 of the resolution order for one symbolic dim (None: nothing binds it)."""
    named = isinstance(dim, str)
    if (spec.name, axis) in res.axis_values:
        return res.axis_values[(spec.name, axis)]
    if named and dim in res.dim_values:
        return res.dim_values[dim]
    if axis == 0 and batch is not None:
        return batch
    if named and dim in defaults:
        return defaults[dim]
    if axis in image_defaults and _is_image_input(spec):
        res.notes.append(f"input '{spec.name}' axis {axis}: {image_defaults[axis]} from the model's Ultralytics "
                         "metadata imgsz (--shape to change)")
        return image_defaults[axis]
    if axis == 0:
        res.notes.append(f"batch dimension of input '{spec.name}' not given: using 1 (--batch N to change)")
        return 1
    if examples is not None:
        return examples.get(dim_label(spec.name, axis, dim if named else None))
    return None


def _split_bindings(model: Model, shapes: dict[str, tuple[int, ...]]):
    input_names = {s.name for s in model.inputs}
    dim_values: dict[str, int] = {}
    explicit: dict[str, tuple[int, ...]] = {}
    axis_values: dict[tuple[str, int], int] = {}
    for key, dims in shapes.items():
        axis = _input_axis(model, key)
        if key in input_names:
            explicit[key] = tuple(dims)
        elif len(dims) == 1 and _is_dim_param(model, key):
            dim_values[key] = dims[0]
        elif len(dims) == 1 and axis is not None:
            axis_values[axis] = int(dims[0])
        else:
            raise ShapeError(
                f"--shape names '{key}', which is neither an input nor a symbolic dimension of the model.",
                f"Inputs: {', '.join(sorted(input_names))}; symbolic dims: "
                f"{', '.join(sorted(_dim_params(model))) or 'none'}; one axis of an input: INPUT:AXIS=VALUE "
                f"({', '.join(_symbolic_axes(model)) or 'none'}).",
            )
    return explicit, dim_values, axis_values


def _input_axis(model: Model, key: str) -> tuple[str, int] | None:
    """``(input, axis)`` for a key ``INPUT:AXIS`` naming a symbolic axis of an input; None otherwise."""
    name, sep, axis = key.rpartition(":")
    if not sep or not axis.isdigit():
        return None
    for spec in model.inputs:
        if spec.name == name and spec.shape is not None and int(axis) < len(spec.shape) \
                and not (isinstance(spec.shape[int(axis)], int) and spec.shape[int(axis)] > 0):
            return name, int(axis)
    return None


def _symbolic_axes(model: Model) -> list[str]:
    """``INPUT:AXIS`` of every symbolic input axis."""
    return [f"{s.name}:{a}" for s in model.inputs for a, d in enumerate(s.shape or ())
            if not (isinstance(d, int) and d > 0)]


def check_full_shape(spec: TensorSpec, dims: tuple[int, ...]) -> None:
    """A ShapeError unless ``dims`` can be ``spec``'s full shape (a tensor; its rank; its fixed dims), worded as
    for ``--shape INPUT=DIMS``."""
    _check_explicit(spec, tuple(dims), {})


def _check_explicit(spec: TensorSpec, dims: tuple[int, ...], dim_values: dict[str, int]) -> None:
    if not spec.is_tensor:
        raise ShapeError(
            f"Input '{spec.name}' is a {spec.type_text}, not a tensor; --shape cannot bind it.",
            f"Give its value with --input {spec.name}=FILE.pb.",
        )
    if spec.shape is not None and len(dims) != len(spec.shape):
        raise ShapeError(
            f"Input '{spec.name}' has rank {len(spec.shape)} {spec.shape_text()}; the binding gives "
            f"{len(dims)} dims ({'x'.join(map(str, dims))}).",
            f"Give {len(spec.shape)} dims, e.g. --shape {spec.name}={_example(spec)}.",
        )
    for axis, (want, got) in enumerate(zip(spec.shape or (), dims)):
        if want is None and got != 0 and _declared_empty(spec, axis):
            raise _empty_axis_bound(spec, axis, got, "Give 0 on that axis")
        if isinstance(want, int) and want != got:
            raise ShapeError(
                f"Input '{spec.name}' axis {axis} is fixed to {want}; the binding gives {got}.",
                f"Use --shape {spec.name}={_example(spec)}.",
            )
        if isinstance(want, str):
            _set_dim(dim_values, want, got, spec.name)


def _bound(model: Model, res: _Resolution) -> Model:
    return dataclasses.replace(model, dim_values=res.dim_values, input_shapes=res.resolved,
                               notes=tuple(dict.fromkeys(res.notes)), bound=True)


def _unique(dims: list[UnboundDim]) -> list[UnboundDim]:
    return list({d.label: d for d in dims}.values())


def example_value(spec: TensorSpec, axis: int, dim) -> int:
    """An example size for a dim nothing binds: 1 for batch-named dims, 640 for an image's height/width,
    128 otherwise (a sequence length, a sample count)."""
    name = dim.lower() if isinstance(dim, str) else ""
    if "batch" in name:
        return 1
    if name in ("height", "width", "h", "w") or (_is_image_input(spec) and axis in _spatial_axes(spec)):
        return EXAMPLE_IMAGE_SIZE
    return EXAMPLE_OTHER_SIZE


def _is_image_input(spec: TensorSpec) -> bool:
    return spec.is_tensor and spec.shape is not None and len(spec.shape) == 4 and spec.dtype.startswith("float")


def _spatial_axes(spec: TensorSpec) -> tuple[int, int]:
    """NHWC when the last dim is a fixed channel count (1, 3, 4) and axis 1 is not; else NCHW."""
    shape = spec.shape or ()
    if len(shape) == 4 and shape[3] in (1, 3, 4) and shape[1] not in (1, 3, 4):
        return (1, 2)
    return (2, 3)


def _ultralytics_image_size(model: Model) -> dict[int, int]:
    """axis -> size of the image input from Ultralytics' ``imgsz`` metadata ("[640, 640]" or "640"); the
    export writes it with ``task`` (detect, segment, classify, pose, obb). Empty for other models."""
    meta = model.metadata
    raw = meta.get(ULTRALYTICS_IMGSZ_KEY)
    if not raw or "task" not in meta:
        return {}
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return {}
    sizes = [value, value] if isinstance(value, int) else list(value) if isinstance(value, (list, tuple)) else []
    if len(sizes) != 2 or not all(isinstance(s, int) and s > 0 for s in sizes):
        return {}
    images = [s for s in model.inputs if _is_image_input(s)]
    if len(images) != 1:
        return {}
    h_axis, w_axis = _spatial_axes(images[0])
    return {h_axis: sizes[0], w_axis: sizes[1]}


def _set_dim(dim_values: dict[str, int], name: str, value: int, where: str) -> None:
    if dim_values.get(name, value) != value:
        raise ShapeError(
            f"Symbolic dimension '{name}' is bound to {dim_values[name]} elsewhere but to {value} by input "
            f"'{where}'.",
            f"Inputs that share the dimension '{name}' need the same size.",
        )
    dim_values[name] = value


def _dim_params(model: Model) -> set[str]:
    return {d for s in model.inputs for d in (s.shape or ()) if isinstance(d, str)}


def _is_dim_param(model: Model, name: str) -> bool:
    return name in _dim_params(model)


def _metadata_dim_defaults(model: Model) -> dict[str, int]:
    raw = model.metadata.get(DIM_DEFAULTS_KEY)
    if not raw:
        return {}
    try:
        return {str(k): int(v) for k, v in json.loads(raw).items()}
    except (ValueError, AttributeError):
        return {}


def _example(spec: TensorSpec) -> str:
    """An example full shape: fixed dims as they are, 1 for the batch axis, example values elsewhere."""
    dims = spec.shape or (1,)
    return "x".join(str(d) if isinstance(d, int) else ("1" if i == 0 else str(example_value(spec, i, d)))
                    for i, d in enumerate(dims))
