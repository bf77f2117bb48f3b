"""Binding a model's symbolic input dimensions to sizes (``Model.bind``), with errors that name the dim.

Split from model.py; it works on a Model's inputs and metadata only and returns a ``dataclasses.replace``d copy.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

from onnxaccel.errors import ShapeError

if TYPE_CHECKING:
    from onnxaccel.model import Model, TensorSpec

#: Model metadata key holding JSON defaults for symbolic dims, e.g. {"sequence": 128} (set by the zoo).
DIM_DEFAULTS_KEY = "onnxaccel.dim_defaults"


def bind_shapes(model: Model, shapes: dict[str, tuple[int, ...]], batch: int | None) -> Model:
    """``Model.bind``: a copy of ``model`` whose every tensor input has a concrete shape (its docstring says how)."""
    input_names = {s.name for s in model.inputs}
    dim_values: dict[str, int] = {}
    explicit: dict[str, tuple[int, ...]] = {}
    for key, dims in shapes.items():
        if key in input_names:
            explicit[key] = dims
        elif len(dims) == 1 and _is_dim_param(model, key):
            dim_values[key] = dims[0]
        else:
            raise ShapeError(
                f"--shape names '{key}', which is neither an input nor a symbolic dimension of the model.",
                f"Inputs: {', '.join(sorted(input_names))}; symbolic dims: "
                f"{', '.join(sorted(_dim_params(model))) or 'none'}.",
            )
    if batch is not None and batch < 1:
        raise ShapeError(f"--batch must be at least 1, got {batch}.", "Pass --batch 1 or more.")

    for spec in model.inputs:
        if spec.name not in explicit:
            continue
        dims = explicit[spec.name]
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
            if isinstance(want, int) and want != got:
                raise ShapeError(
                    f"Input '{spec.name}' axis {axis} is fixed to {want}; the binding gives {got}.",
                    f"Use --shape {spec.name}={_example(spec)}.",
                )
            if isinstance(want, str):
                _set_dim(dim_values, want, got, spec.name)

    notes = list(model.notes)
    defaults = _metadata_dim_defaults(model)
    resolved: dict[str, tuple[int, ...]] = {}
    unbound: list[str] = []
    for spec in model.inputs:
        if spec.name in explicit:
            resolved[spec.name] = explicit[spec.name]
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
            value = dim_values.get(dim) if isinstance(dim, str) else None
            if value is None and axis == 0 and batch is not None:
                value = batch
            if value is None and isinstance(dim, str) and dim in defaults:
                value = defaults[dim]
            if value is None and axis == 0:
                value = 1
                notes.append(f"batch dimension of input '{spec.name}' not given: using 1 (--batch N to change)")
            if value is None:
                label = f"'{dim}'" if isinstance(dim, str) else "unnamed"
                unbound.append(f"input '{spec.name}' axis {axis} ({label})")
                dims.append(0)
                continue
            if isinstance(dim, str):
                _set_dim(dim_values, dim, value, spec.name)
            dims.append(value)
        resolved[spec.name] = tuple(dims)
    if unbound:
        first = next(s for s in model.inputs if s.name not in explicit and s.shape is not None)
        raise ShapeError(
            "Symbolic dimensions left unbound: " + "; ".join(unbound) + ".",
            f"Bind them with --shape INPUT=DIMS (e.g. --shape {first.name}={_example(first)}) or "
            "--shape DIM=VALUE for a named dim, and --batch N for the batch axis.",
        )
    return dataclasses.replace(model, dim_values=dim_values, input_shapes=resolved,
                               notes=tuple(dict.fromkeys(notes)), bound=True)


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
    """An example binding: fixed dims as they are, 1 for the batch axis, 64 for other free dims."""
    dims = spec.shape or (1,)
    return "x".join(str(d) if isinstance(d, int) else ("1" if i == 0 else "64") for i, d in enumerate(dims))
