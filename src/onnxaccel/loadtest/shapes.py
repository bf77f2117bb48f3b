"""The shapes a load test's requests carry: the server's model metadata bound by --shape and --batch, with the
binding rules and the wording of the other commands (model_shapes.py).

The protocol's metadata gives every variable axis as -1, without its name. ``--shape INPUT=DIMS`` gives an
input's full shape (checked against its rank and fixed dims); ``--shape DIM=VALUE`` (a named dim, as `run`,
`bench` and `batch` take it) sets the variable axis besides the batch axis of every input that has one, since
the metadata cannot tell one named axis from another; ``--batch`` sets a variable axis 0 that ``--shape`` leaves
free, and the report counts the rows requests carry there (:func:`request_rows`). ``--batch N`` (N > 1)
that no input can take (every axis 0 fixed by the model or given by ``--shape`` to another size) is refused, as
the report counts N rows per request. What nothing binds is named in an error whose command line keeps the
model's fixed dims and fills only the free ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

import numpy as np

from onnxaccel.errors import ShapeError
from onnxaccel.model import TensorSpec
from onnxaccel.model_shapes import UnboundDim, binding_args, check_full_shape, example_value, unbound_error
from onnxaccel.serve.protocol import DATATYPES


def served_specs(metadata: dict) -> dict[str, TensorSpec]:
    """The model's inputs as the metadata gives them: fixed dims as ints, variable ones (-1) as None."""
    specs = {}
    for tensor in metadata.get("inputs", []):
        dtype = DATATYPES.get(tensor.get("datatype"))
        shape = tuple(None if int(d) < 0 else int(d) for d in tensor.get("shape", ()))
        specs[tensor["name"]] = TensorSpec(tensor["name"], np.dtype(dtype).name if dtype is not None else "object",
                                           shape)
    return specs


def request_dims(metadata: dict, batch: int, shapes: Mapping[str, tuple[int, ...]],
                 source: str) -> dict[str, list[int | None]]:
    """Per input, the dims its requests have (None where nothing binds them yet: a shape mix may fill them).
    ``source`` is how error messages name the model on the command line (``URL --model NAME``)."""
    specs = served_specs(metadata)
    served = _served(specs, source)
    explicit = {k: tuple(v) for k, v in shapes.items() if k in specs}
    named = {k: tuple(v) for k, v in shapes.items() if k not in specs}
    for key, dims in named.items():
        if len(dims) != 1:
            raise ShapeError(f"--shape names '{key}', which is not an input of the served model.",
                             f"Inputs: {', '.join(sorted(specs))}; --shape DIM=VALUE binds a named dimension.")
    for name, dims in explicit.items():
        check_full_shape(specs[name], dims)
    out: dict[str, list[int | None]] = {}
    for name, spec in specs.items():
        dims = list(explicit.get(name, spec.shape))
        if dims and dims[0] is None:
            dims[0] = batch
        out[name] = dims
    _check_batch_taken(specs, explicit, out, batch)
    if named:
        free = {name: [axis for axis, d in enumerate(dims) if d is None] for name, dims in out.items()}
        given = ", ".join(f"{k}={v[0]}" for k, v in named.items())
        if len(named) > 1 or any(len(axes) > 1 for axes in free.values()):
            raise _ambiguous(served, out, explicit, given)
        if not any(free.values()):
            raise ShapeError(f"--shape {given} binds nothing: no input of the served model has a variable axis "
                             "besides the batch axis.", "Drop it, or give an input's full shape: --shape INPUT=DIMS.")
        size = next(iter(named.values()))[0]
        for name, axes in free.items():
            for axis in axes:
                out[name][axis] = size
    return out


def request_rows(metadata: dict, inputs: Mapping[str, np.ndarray], batch: int) -> int:
    """The rows one request carries, which the report counts as inferences: axis 0 of the inputs whose axis 0 the
    served model leaves variable (set by ``--batch``, or by ``--shape INPUT=DIMS`` where it gives that axis), the
    largest where they differ; ``batch`` where no input has a variable axis 0 (a fixed axis 0 may be no batch
    axis at all, as Silero VAD's state[2, batch, 128])."""
    specs = served_specs(metadata)
    sizes = [int(np.shape(value)[0]) for name, value in inputs.items()
             if name in specs and specs[name].shape and specs[name].shape[0] is None and np.ndim(value)]
    return max(sizes) if sizes else batch


def _check_batch_taken(specs: Mapping[str, TensorSpec], explicit: Mapping[str, tuple[int, ...]],
                       dims: Mapping[str, list[int | None]], batch: int) -> None:
    """A ShapeError when ``batch`` > 1 and no input's axis 0 carries that many rows: requests would carry
    fewer rows than the report counts (``batch`` per request)."""
    if batch <= 1 or not dims or any(values and values[0] == batch for values in dims.values()):
        return
    name, values = next(((k, v) for k, v in dims.items() if v), (None, None))
    if name is None:
        raise ShapeError(f"--batch {batch}: no input of the served model has a batch axis (all are scalars).",
                         "Leave --batch out; raise --concurrency (-c) to put more load on the server.")
    fixed = bool(specs[name].shape) and specs[name].shape[0] is not None
    rows = f"{values[0]} row{'s' if values[0] != 1 else ''}"
    if name in explicit and not fixed:
        given = "x".join(map(str, explicit[name]))
        raise ShapeError(
            f"--batch {batch}: --shape {name}={given} gives input '{name}' axis 0 as {values[0]}, so each request "
            f"would carry {rows} while the report would count {batch}.",
            f"Make them agree: --batch {values[0]} with that shape, or give --shape {name} with {batch} on axis 0.",
        )
    raise ShapeError(
        f"--batch {batch}: input '{name}' axis 0 is fixed to {values[0]} in the served model "
        f"{specs[name].shape_text()}, so each request can carry only {rows}, not {batch}.",
        f"Leave --batch out (or give --batch {values[0]}); to put more load on the server raise --concurrency (-c); "
        f"to send {batch} rows per request, serve a model whose batch axis is variable.",
    )


def require_bound(metadata: dict, dims: Mapping[str, list[int | None]], shapes: Mapping[str, tuple[int, ...]],
                  source: str) -> None:
    """A ShapeError naming every axis still free, with a command line binding them (the model's fixed dims
    kept, example values for the free ones), as the other commands word it."""
    specs = served_specs(metadata)
    unbound = [UnboundDim(name, axis, None, example_value(specs[name], axis, None))
               for name, values in dims.items() for axis, d in enumerate(values) if d is None]
    if unbound:
        raise unbound_error(_served(specs, source), unbound, _kept(shapes, specs), _known(dims))


def _ambiguous(served, dims: Mapping[str, list[int | None]], explicit: Mapping[str, tuple[int, ...]],
               given: str) -> ShapeError:
    unbound = [UnboundDim(name, axis, None, example_value(served.input(name), axis, None))
               for name, values in dims.items() for axis, d in enumerate(values) if d is None]
    args = binding_args(served, unbound, explicit, _known(dims))
    return ShapeError(
        f"--shape {given}: the server's model metadata gives variable dims as -1, without their names, so a "
        "named dim binds only where each input has one variable axis besides the batch axis, and only one "
        "named dim can be given.",
        f"Give the inputs' full shapes, e.g. (example values): onnxaccel loadtest {served.source} {' '.join(args)}",
    )


def _served(specs: Mapping[str, TensorSpec], source: str) -> SimpleNamespace:
    """What model_shapes' messages read of a model: how to name it on the command line, and its inputs."""
    return SimpleNamespace(source=source, input=specs.__getitem__, inputs=tuple(specs.values()))


def _known(dims: Mapping[str, list[int | None]]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(d or 0 for d in values) for name, values in dims.items()}


def _kept(shapes: Mapping[str, tuple[int, ...]], specs: Mapping[str, TensorSpec]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v) for k, v in shapes.items() if k in specs}
