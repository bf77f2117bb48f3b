"""Making what an artifacts directory holds (``onnxaccel compile -o DIR``): the model transformations a writable
:class:`~onnxaccel.engines.artifacts.ArtifactStore` calls when a start asks for an artifact it lacks.

The store (engines layer, below the pipeline that loads from it) owns the layout, the keys and the manifest; the
models are written here, with the tools of this layer: every model through ``precision.checkpoint.save_model``
(topological order, ``onnx.checker.check_model(full_check=True)``, atomic), the optimized graph through
transform/cached_compile.py ``save_optimized``, the one the compile cache uses. :func:`compiling` makes a
directory the writable store for the duration of a ``with`` block: whatever the consumer's own start-up path
builds inside it (serve's ``load_instance``, batch's worker, run's ``prepare``) is made, saved and recorded.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import onnx

from onnxaccel.engines import artifacts
from onnxaccel.model import Model
from onnxaccel.precision.checkpoint import save_model
from onnxaccel.target import Target
from onnxaccel.transform.cached_compile import save_optimized


class ModelArtifactBuilder:
    """Writes an artifacts directory's models (engines/artifacts.py ``ArtifactBuilder``)."""

    def save_model(self, model: Model, path: Path, *, what: str) -> None:
        """Copy ``model`` (weights included) to ``path``, fully checked."""
        save_model(onnx.load(str(model.path)), path, converter=f"onnxaccel compile ({what})")

    def optimize(self, model: Model, target: Target, path: Path) -> str:
        """ONNX Runtime's graph of ``model`` optimized for ``target``, saved to ``path``; a note saying how."""
        level = save_optimized(model, target, path, purpose="an artifacts directory")
        return f"ONNX Runtime's optimizer at level '{level}' for {target.provider}"


@contextlib.contextmanager
def compiling(directory: str | os.PathLike) -> Iterator[artifacts.ArtifactStore]:
    """``directory`` as the active, writable store inside the block; its manifest is written when the block
    ends without an error (what was made before an error stays on disk, unlisted, and is made again next time)."""
    with artifacts.use(directory, builder=ModelArtifactBuilder()) as store:
        yield store
        store.commit()
