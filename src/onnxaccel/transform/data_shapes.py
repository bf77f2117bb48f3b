"""Shapes that ``--eval-data`` (or ``--calibration``) arrays give the model's symbolic dims.

Step 2 of the resolution order (docs/SHAPES.md): the shapes of the data the user gave bind the dims that
``--shape`` leaves open, before metadata defaults, the batch default and the unbound-dim error. Only the
array forms are read here (an .npz named by input, one .npy, a folder of them: the first file); a folder of
images leaves the shapes to the other steps (images are resized to the bound shape, not the other way round).
An array binds its input only when it fits (rank, fixed dims); one that does not is left for the data loader
(calibration.py) to report with the expected shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from onnxaccel.model import Model, TensorSpec


def data_shapes(spec: str | None, model: Model, explicit: Mapping[str, tuple[int, ...]],
                batch: int | None) -> dict[str, tuple[int, ...]]:
    """Full input shapes (for ``Model.bind``) read from the arrays at ``spec``; {} when there are none.

    An array of the input's rank is a batch along axis 0 (one run takes ``batch``, the fixed axis 0, or 1 row);
    one more axis in front indexes samples, so its other axes are the input's shape (calibration.py's
    ``_split`` reads the data the same way). Inputs or dims that ``explicit`` (``--shape``) binds are skipped.
    """
    arrays = _array_shapes(spec, model)
    out = {}
    for spec_ in model.inputs:
        shape = arrays.get(spec_.name)
        if shape is None or not spec_.is_tensor or spec_.shape is None or spec_.name in explicit:
            continue
        if any(isinstance(d, str) and d in explicit for d in spec_.shape):
            continue
        full = _per_run(spec_, shape, batch)
        if full is not None:
            out[spec_.name] = full
    return out


def _per_run(spec: TensorSpec, shape: tuple[int, ...], batch: int | None) -> tuple[int, ...] | None:
    want = spec.shape or ()
    if len(shape) == len(want) + 1:
        shape = shape[1:]
    elif len(shape) == len(want) and shape:
        first = want[0] if isinstance(want[0], int) else (batch or 1)
        shape = (first,) + shape[1:]
    else:
        return None
    if any(isinstance(w, int) and w != s for w, s in zip(want, shape)):
        return None
    return tuple(shape)


def _array_shapes(spec: str | None, model: Model) -> dict[str, tuple[int, ...]]:
    if not spec:
        return {}
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in (".npy", ".npz") and not p.name.startswith("."))
        if not files:
            return {}
        path = files[0]
    try:
        if path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as data:
                shapes = {k: tuple(data[k].shape) for k in data.files}
            names = [s.name for s in model.inputs]
            if len(shapes) == 1 and len(names) == 1 and names[0] not in shapes:
                shapes = {names[0]: next(iter(shapes.values()))}
            return shapes
        if path.suffix.lower() == ".npy" and len(model.inputs) == 1:
            return {model.inputs[0].name: tuple(np.load(path, mmap_mode="r", allow_pickle=False).shape)}
    except Exception:  # noqa: BLE001 - unreadable data is reported by the loader, with the file named
        return {}
    return {}
