"""The one feed checker: feeds against a model's inputs (names, kinds, element types, ranks, fixed axes).

Two entry points share its rules and wording, so a user reads the same message whichever path refused a value:

* :class:`FeedCheck`, the runner's check (``Runner.run`` and ``Runner.bind`` call it once per call; after
  Polygraphy's ``BaseRunner.infer``, which checks feeds against the runner's input metadata before
  ``infer_impl``: NVIDIA/TensorRT tools/Polygraphy/polygraphy/backend/base/runner.py). It converts nothing
  and remembers the signatures that passed (names, dtypes and ranks, or shapes where fixed axes are checked),
  so a repeated call costs one key lookup. What is wrong comes back as a :class:`FeedProblem`, which each
  caller words for its user: the runner as an :class:`~onnxaccel.errors.InputError`, serve as a protocol error
  400 (serve/signature.py, with fixed axes, per request).
* :func:`validate_feeds`, for values read from files and literals (inputs.prepare_feeds, calibration): the same
  checks, plus containers (sequences, optionals, maps) and the bound shapes, and a cast where it is lossless.
  :func:`conform` is that cast alone, for an engine that takes such feeds (the native MIGraphX runner).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx

from onnxaccel.errors import InputError
from onnxaccel.model import Model, TensorSpec

#: Passing signatures kept per check. One model has one passing signature per feed order (and string
#: inputs given as str or object arrays); past this many the check simply runs again each time.
MAX_SIGNATURES = 64

_RESHAPE = "Reshape the array, or check that it belongs to this input."
_RESIZE = "Resize or reshape the data to the model's input shape."


# -- the runner's check ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class FeedProblem:
    """The first thing wrong with a set of feeds.

    ``kind`` is ``unknown`` (``names``: the feeds the model has no input for, in the order given), ``missing``
    (``names``: the model's inputs without a feed, in model order), ``dtype`` (``want``/``got``: numpy dtypes),
    ``rank`` (``want``: the rank, ``got``: the shape given) or ``axis`` (``axis``, ``want``: its fixed size,
    ``got``: the shape given). ``name`` is the input concerned (the first of ``names``).
    """

    kind: str
    name: str
    names: tuple[str, ...] = ()
    want: object = None
    got: object = None
    axis: int = -1


def _spec_dtype(spec: TensorSpec) -> np.dtype | None:
    try:
        return spec.np_dtype
    except TypeError:  # an element type numpy cannot name here: left to the runtime
        return None


class FeedCheck:
    """A model's inputs as feeds are checked against them: names, element types, ranks (and fixed axes).

    ``casts``: a dtype that casts to the input's without loss passes (the runner casts it, see :func:`conform`);
    else only the input's own dtype does. ``axes``: :meth:`__call__` checks fixed axes too (else they are left
    to a runtime that checks them itself, and to ``problem(feeds, axes=True)``).
    """

    def __init__(self, inputs: Sequence[TensorSpec], *, casts: bool = False, axes: bool = False) -> None:
        self.names = tuple(s.name for s in inputs)
        self.casts = casts
        self.axes = axes
        self._known = frozenset(self.names)
        tensors = [s for s in inputs if s.is_tensor]
        self._dtypes = {s.name: d for s in tensors if (d := _spec_dtype(s)) is not None}
        self._ranks = {s.name: len(s.shape) for s in tensors if s.shape is not None}
        self._fixed = {s.name: tuple((axis, d) for axis, d in enumerate(s.shape) if isinstance(d, int))
                       for s in tensors if s.shape is not None}
        self._shape_text = {s.name: s.shape_text() for s in tensors}
        self._passed: set[tuple] = set()

    def problem(self, feeds: Mapping[str, object], *, axes: bool | None = None) -> FeedProblem | None:
        """The first problem of ``feeds`` (unknown names, then missing ones, then per input in model order its
        dtype and rank, and with ``axes`` (default: the check's own setting) its fixed axes), or None. Values
        without a dtype (lists, None, OrtValues) are checked by name only."""
        axes = self.axes if axes is None else axes
        unknown = tuple(n for n in feeds if n not in self._known)
        if unknown:
            return FeedProblem("unknown", unknown[0], unknown)
        if len(feeds) != len(self.names):
            missing = tuple(n for n in self.names if n not in feeds)
            return FeedProblem("missing", missing[0], missing)
        for name in self.names:
            value = feeds[name]
            got = getattr(value, "dtype", None)
            if got is None:
                continue
            want = self._dtypes.get(name)
            if want is not None and got != want and not _takes(want, got, self.casts):
                return FeedProblem("dtype", name, want=want, got=got)
            rank = self._ranks.get(name)
            if rank is None:
                continue
            shape = value.shape
            if len(shape) != rank:
                return FeedProblem("rank", name, want=rank, got=tuple(shape))
            if axes:
                for axis, size in self._fixed[name]:
                    if shape[axis] != size:
                        return FeedProblem("axis", name, want=size, got=tuple(shape), axis=axis)
        return None

    def __call__(self, feeds: Mapping[str, object]) -> None:
        """Raise InputError when ``feeds`` do not fit; a signature that passed once is not checked again."""
        try:
            if self.axes:
                key = tuple([(n, v.dtype, v.shape) for n, v in feeds.items()])
            else:
                key = tuple([(n, v.dtype, v.ndim) for n, v in feeds.items()])
        except AttributeError:  # lists, None, OrtValues among the feeds
            key = tuple((n, getattr(v, "dtype", type(v)), getattr(v, "shape", -1)) for n, v in feeds.items())
        if key in self._passed:
            return
        found = self.problem(feeds)
        if found is not None:
            raise self.error(found)
        if len(self._passed) < MAX_SIGNATURES:
            self._passed.add(key)

    def error(self, found: FeedProblem) -> InputError:
        """``found`` as the InputError a library or CLI user sees (the wording of :func:`validate_feeds` too)."""
        inputs = ", ".join(self.names)
        if found.kind == "unknown":
            return _unknown(found.names, inputs)
        if found.kind == "missing":
            return _missing(found.names, f"Give a value for every input of the model: {inputs}.")
        if found.kind == "dtype":
            want, got = dtype_text(found.want), dtype_text(found.got)
            if want == "string":
                hint = "Give it as an array of str."
            elif self.casts:
                hint = f"Convert it first (e.g. array.astype(np.{want})); this runner casts only where no value changes."
            else:
                hint = f"Convert it first (e.g. array.astype(np.{want})); runners do not cast."
            return _dtype(found.name, found.want, found.got, hint)
        spec = self._shape_text[found.name]
        if found.kind == "rank":
            return _rank(found.name, found.want, spec, found.got)
        return _axis(found.name, found.axis, found.want, spec, found.got)


def _takes(want: np.dtype, got: np.dtype, casts: bool) -> bool:
    """Whether a feed of dtype ``got`` is taken for an input of ``want`` (other than being ``want``)."""
    if want.kind == "O":
        return got.kind in "OUS"  # strings as object or numpy str/bytes arrays
    return casts and np.can_cast(got, want, casting="safe")


# -- the wording both entry points share ----------------------------------------------------------------

def _unknown(names: Sequence[str], inputs: str) -> InputError:
    return InputError(f"Unknown input name(s): {', '.join(names)}.", f"The model's inputs are: {inputs}.")


def _missing(names: Sequence[str], hint: str) -> InputError:
    return InputError(f"No value for input(s): {', '.join(names)}.", hint)


def _dtype(where: str, want: np.dtype, got: np.dtype, hint: str) -> InputError:
    return InputError(f"Input '{where}' expects {dtype_text(want)}; the value given is {dtype_text(got)}.", hint)


def _rank(name: str, rank: int, spec: str, shape: Sequence[int]) -> InputError:
    return InputError(f"Input '{name}' expects rank {rank} {spec}; the value given has shape {list(shape)}.",
                      _RESHAPE)


def _axis(name: str, axis: int, size: int, spec: str, shape: Sequence[int]) -> InputError:
    return InputError(f"Input '{name}' axis {axis} must be {size} {spec}; the value given has shape "
                      f"{list(shape)}.", _RESIZE)


def dtype_text(dtype: np.dtype) -> str:
    """A dtype as people read it (``string`` for numpy's str/object kinds)."""
    return "string" if dtype.kind in "OUS" else dtype.name


# -- values from files and literals ---------------------------------------------------------------------
def validate_feeds(model: Model, feeds: Mapping[str, Any]) -> dict[str, Any]:
    """Check names, types and shapes against the signature; cast only when the cast is lossless.

    Tensors become C-contiguous numpy arrays of the input's dtype (0-d arrays stay 0-d; numpy unicode or
    bytes arrays become the object arrays of str ONNX Runtime takes for strings); sequences become lists of
    them, optionals None or their value.
    """
    names = {s.name for s in model.inputs}
    unknown = sorted(set(feeds) - names)
    if unknown:
        raise _unknown(unknown, ", ".join(sorted(names)))
    missing = sorted(names - set(feeds))
    if missing:
        raise _missing(missing, "Give them with --input NAME=FILE.")
    out = {}
    for spec in model.inputs:
        value = feeds[spec.name]
        if spec.is_tensor:
            out[spec.name] = check_tensor(model, spec, value)
        else:
            out[spec.name] = _check_value(spec, spec.type_proto, value, spec.name)
    return out


def _check_value(spec: TensorSpec, tp, value: Any, where: str) -> Any:
    """A sequence / optional / map value against its TypeProto; tensors inside are converted."""
    kind = tp.WhichOneof("value") if tp is not None else "tensor_type"
    if kind == "optional_type":
        return None if value is None else _check_value(spec, tp.optional_type.elem_type, value, where)
    if kind == "sequence_type":
        if not isinstance(value, (list, tuple)):
            raise InputError(
                f"Input '{where}' is a {spec.type_text}; the value given is a {type(value).__name__}, not a list.",
                f"Give it as an ONNX SequenceProto: --input {spec.name}=FILE.pb.",
            )
        return [_check_value(spec, tp.sequence_type.elem_type, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if kind == "map_type":
        if not isinstance(value, dict):
            raise InputError(f"Input '{where}' is a {spec.type_text}; the value given is not a map.",
                             f"Give it as an ONNX MapProto: --input {spec.name}=FILE.pb.")
        return value
    if value is None or isinstance(value, (list, dict)):
        raise InputError(f"Input '{where}' expects a tensor; the value given is {type(value).__name__}.",
                         "Check that the file belongs to this input.")
    elem = tp.tensor_type.elem_type if tp is not None else spec.elem_type
    return _convert_dtype(np.asarray(value), _np_dtype(elem, spec), where)


def _np_dtype(elem_type: int, spec: TensorSpec) -> np.dtype:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return spec.np_dtype


def check_tensor(model: Model, spec: TensorSpec, value: Any) -> np.ndarray:
    """``value`` as the array ``spec`` takes: rank, fixed dims and dtype checked (a lossless cast at most)."""
    if value is None or isinstance(value, (list, dict)):
        raise InputError(f"Input '{spec.name}' expects a tensor; the value given is {type(value).__name__}.",
                         "Check that the file belongs to this input.")
    arr = _convert_dtype(np.asarray(value), spec.np_dtype, spec.name)
    if spec.shape is not None:
        if arr.ndim != len(spec.shape):
            raise _rank(spec.name, len(spec.shape), spec.shape_text(), arr.shape)
        for axis, (dim, got) in enumerate(zip(spec.shape, arr.shape)):
            if isinstance(dim, int) and dim > 0 and dim != got:
                raise _axis(spec.name, axis, dim, spec.shape_text(), arr.shape)
    bound = model.input_shapes.get(spec.name)
    if bound is not None and tuple(arr.shape) != tuple(bound):
        raise InputError(
            f"Input '{spec.name}' is bound to shape {list(bound)} but the value given has shape "
            f"{list(arr.shape)}.",
            f"Bind it to the data: --shape {spec.name}={'x'.join(map(str, arr.shape))}.",
        )
    return arr


def conform(value: Any, want: np.dtype, where: str) -> np.ndarray:
    """``value`` as a C-contiguous array of ``want``, cast only where no value changes (InputError otherwise):
    what :func:`validate_feeds` does to a tensor, without its checks of names and shapes. For an engine that
    casts the feeds its runner's :class:`FeedCheck` (``casts=True``) let through."""
    if type(value) is np.ndarray and value.dtype == want and value.flags.c_contiguous:
        return value
    return _convert_dtype(np.asarray(value), want, where)


def _convert_dtype(arr: np.ndarray, want: np.dtype, where: str) -> np.ndarray:
    """Lossless conversion to ``want``; C-contiguous; 0-d stays 0-d (np.ascontiguousarray makes it 1-d)."""
    if arr.dtype != want:
        if want.kind == "O" and arr.dtype.kind in "US":
            # ONNX Runtime takes string tensors as object arrays of str (numpy unicode arrays are refused).
            arr = np.vectorize(_text, otypes=[object])(arr) if arr.size else arr.astype(object)
        elif want.kind == "O" and arr.dtype.kind == "O":
            pass
        elif arr.dtype.kind == "V" and not _is_ml(arr.dtype) and arr.dtype.itemsize == want.itemsize:
            arr = arr.view(want)  # an ml_dtypes array saved by np.save reads back as raw bytes ('|V2')
        elif want.kind == "b" and arr.dtype.kind == "O" and all(isinstance(v, (bool, np.bool_)) for v in arr.flat):
            arr = arr.astype(bool)
        elif _is_ml(want) and arr.dtype.kind in "iu" and _int_fits(arr, want):
            arr = arr.astype(want)  # int4/uint4 given as int8/uint8 values inside their range
        elif np.can_cast(arr.dtype, want, casting="safe"):
            arr = arr.astype(want)
        else:
            hint = f"Save it as {want.name}, e.g. np.save(path, array.astype(np.{want.name}))."
            if _is_ml(want):
                hint = (f"Save it as {want.name}: np.save(path, array.astype(ml_dtypes.{want.name})), or write a "
                        f".pb with onnx.numpy_helper.from_array(array.astype(ml_dtypes.{want.name})).")
            elif want.kind == "O":
                hint = "Save it as text: np.save(path, np.array(['...'])) (numpy unicode, no pickles)."
            raise _dtype(where, want, arr.dtype, hint)
    if want.kind == "O" and arr.size and not all(isinstance(v, (str, bytes)) for v in arr.flat):
        raise InputError(f"Input '{where}' expects strings; the value given holds other objects.",
                         "Save it as text: np.save(path, np.array(['...'])).")
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _is_ml(dtype: np.dtype) -> bool:
    return dtype.kind == "V" and dtype.type.__module__.startswith("ml_dtypes")


def _int_fits(arr: np.ndarray, want: np.dtype) -> bool:
    try:
        info = ml_dtypes.iinfo(want)
    except (ValueError, TypeError):
        return False
    return not arr.size or (int(arr.min()) >= int(info.min) and int(arr.max()) <= int(info.max))


def fits(spec: TensorSpec, value: np.ndarray) -> bool:
    """Whether ``value``'s rank and fixed dims agree with ``spec`` (so its shape may bind the symbolic ones)."""
    if spec.shape is None:
        return True
    return len(spec.shape) == value.ndim and all(
        not isinstance(d, int) or d == g for d, g in zip(spec.shape, value.shape))
