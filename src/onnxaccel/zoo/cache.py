"""Where built zoo models live on disk, and how they get there without a reader seeing half a file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import onnx

from onnxaccel.errors import ModelError
from onnxaccel.paths import CACHE_ENV as CACHE_DIR_ENV
from onnxaccel.paths import cache_root

#: Bump whenever a builder's output changes, so caches built by an older onnxaccel are not reused.
BUILD_VERSION = 1


def zoo_cache_dir() -> Path:
    """``<cache root>/zoo``: ``$ONNXACCEL_CACHE_DIR/zoo`` if set, else the user cache dir + ``/zoo``."""
    return cache_root() / "zoo"


def cached_model_path(name: str) -> Path:
    """The file that holds zoo model ``name`` as built by this version of the builders."""
    return zoo_cache_dir() / f"{name}-{BUILD_VERSION}.onnx"


def save_atomically(model: onnx.ModelProto | bytes, path: Path) -> Path:
    """Write ``model`` (a ModelProto or its bytes) to ``path`` via a temporary file and ``os.replace``.

    The temporary file sits in the target's folder because ``os.replace`` is atomic (POSIX and Windows)
    only within one file system; a concurrent reader sees either no file or the whole file. Protobuf
    cannot serialize a message over 2 GiB; every zoo model is below that, so each is one ``.onnx`` file.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(model if isinstance(model, bytes) else model.SerializeToString())
        os.replace(tmp_name, path)
    except OSError as exc:
        _remove_quietly(tmp_name)
        raise _unwritable(path, exc) from exc
    except BaseException:
        _remove_quietly(tmp_name)
        raise
    return path


def copy_atomically(source: Path, dest: Path) -> Path:
    """Copy a file to ``dest`` with the same temporary-file-and-replace guarantee as :func:`save_atomically`."""
    import shutil

    dest = Path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        os.close(fd)
    except OSError as exc:
        raise _unwritable(dest, exc) from exc
    try:
        shutil.copyfile(source, tmp_name)
        os.replace(tmp_name, dest)
    except OSError as exc:
        _remove_quietly(tmp_name)
        raise _unwritable(dest, exc) from exc
    return dest


def _unwritable(path: Path, exc: OSError) -> ModelError:
    return ModelError(
        f"Cannot write the model file {path}: {exc.strerror or exc}.",
        f"Choose a writable location, or set {CACHE_DIR_ENV} to a writable directory for the zoo cache.",
        details=str(exc),
    )


def _remove_quietly(name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name)
