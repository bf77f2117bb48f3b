"""Feeds checked against a model's inputs: the runner's check (after Polygraphy's ``BaseRunner``, which checks
feeds against its input metadata before inference).

Names, element types and ranks. A runner checks a binding's feeds once, when it binds them, and words a run
the runtime refused with this check (``OrtRunner.run``: ONNX Runtime checks every feed before it computes, so
the run itself pays nothing). :meth:`FeedCheck.__call__` remembers the signatures that passed (the names,
dtypes and ranks of the feeds given), so a caller that checks before every call pays one small key lookup,
not a check. Fixed axes are left to the caller that knows its shapes per request (serve checks them per request
with the same rules, ``problem(feeds, axes=True)``). What is wrong comes back as a :class:`FeedProblem`, which
each caller words for its user: the runner as an :class:`~onnxaccel.errors.InputError`, serve as a protocol
error 400.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from onnxaccel.errors import InputError
from onnxaccel.model import TensorSpec

#: Passing signatures kept per check. One model has one passing signature per feed order (and string
#: inputs given as str or object arrays); past this many the check simply runs again each time.
MAX_SIGNATURES = 64


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


def _np_dtype(spec: TensorSpec) -> np.dtype | None:
    try:
        return spec.np_dtype
    except TypeError:  # an element type numpy cannot name here: left to the runtime
        return None


class FeedCheck:
    """A model's inputs as feeds are checked against them: names, element types, ranks (and fixed axes)."""

    def __init__(self, inputs: Sequence[TensorSpec]) -> None:
        self.names = tuple(s.name for s in inputs)
        self._known = frozenset(self.names)
        tensors = [s for s in inputs if s.is_tensor]
        self._dtypes = {s.name: d for s in tensors if (d := _np_dtype(s)) is not None}
        self._ranks = {s.name: len(s.shape) for s in tensors if s.shape is not None}
        self._fixed = {s.name: tuple((axis, d) for axis, d in enumerate(s.shape) if isinstance(d, int))
                       for s in tensors if s.shape is not None}
        self._shape_text = {s.name: s.shape_text() for s in tensors}
        self._passed: set[tuple] = set()

    def problem(self, feeds: Mapping[str, object], *, axes: bool = False) -> FeedProblem | None:
        """The first problem of ``feeds`` (unknown names, then missing ones, then per input in model order its
        dtype and rank, and with ``axes`` its fixed axes), or None. Values without a dtype (lists, None,
        OrtValues) are checked by name only."""
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
            if want is not None and got != want and not (want.kind == "O" and got.kind in "OUS"):
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
            key = tuple([(n, v.dtype, v.ndim) for n, v in feeds.items()])
        except AttributeError:  # lists, None, OrtValues among the feeds
            key = tuple((n, getattr(v, "dtype", type(v)), getattr(v, "ndim", -1)) for n, v in feeds.items())
        if key in self._passed:
            return
        found = self.problem(feeds)
        if found is not None:
            raise self.error(found)
        if len(self._passed) < MAX_SIGNATURES:
            self._passed.add(key)

    def error(self, found: FeedProblem) -> InputError:
        """``found`` as the InputError a library or CLI user sees (the wording of inputs.py's checks)."""
        inputs = ", ".join(self.names)
        if found.kind == "unknown":
            return InputError(f"Unknown input name(s): {', '.join(found.names)}.", f"The model's inputs are: {inputs}.")
        if found.kind == "missing":
            return InputError(f"No value for input(s): {', '.join(found.names)}.",
                              f"Give a value for every input of the model: {inputs}.")
        if found.kind == "dtype":
            want, got = _dtype_text(found.want), _dtype_text(found.got)
            return InputError(f"Input '{found.name}' expects {want}; the value given is {got}.",
                              f"Convert it first (e.g. array.astype(np.{want})); runners do not cast." if
                              want != "string" else "Give it as an array of str.")
        shape, spec = list(found.got), self._shape_text[found.name]
        if found.kind == "rank":
            return InputError(f"Input '{found.name}' expects rank {found.want} {spec}; the value given has shape "
                              f"{shape}.", "Reshape the array, or check that it belongs to this input.")
        return InputError(f"Input '{found.name}' axis {found.axis} must be {found.want} {spec}; the value given has "
                          f"shape {shape}.", "Resize or reshape the data to the model's input shape.")


def _dtype_text(dtype: np.dtype) -> str:
    return "string" if dtype.kind in "OUS" else dtype.name
