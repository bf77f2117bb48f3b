"""Built-in models: real architectures with seeded random weights, built on first use and cached.

CNNs (resnet50, densenet121, inception_v1, inception_v2, squeezenet, shufflenet, vgg19, alexnet,
zfnet512) are materialized from the light ONNX Model Zoo copies inside the ``onnx`` package; ``bert-base``
and ``bert-tiny`` are built in the layout PyTorch exports for Hugging Face BERT. Nothing is downloaded.

Every model carries metadata: ``onnxaccel.zoo`` (its name), ``onnxaccel.dim_defaults`` (JSON defaults
for symbolic dimensions other than ``batch``) and, for CNNs, ``onnxaccel.preprocess`` = ``imagenet``.

>>> from onnxaccel.zoo import get_model_path
>>> path = get_model_path("resnet50")   # built once into zoo_cache_dir(), then reused
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from onnxaccel.zoo.cache import BUILD_VERSION, cached_model_path, copy_atomically, save_atomically, zoo_cache_dir
from onnxaccel.zoo.registry import ZooEntry, build_model_bytes, entries, find_recipe

__all__ = ["BUILD_VERSION", "ZooEntry", "export_model", "get_entry", "get_model_path", "list_models", "zoo_cache_dir"]


def list_models() -> list[ZooEntry]:
    """Every zoo model, sorted by name."""
    return [dataclasses.replace(entry, default_dims=dict(entry.default_dims)) for entry in entries()]


def get_entry(name: str) -> ZooEntry:
    """The entry for ``name``; raises :class:`~onnxaccel.errors.ModelNotFoundError` for an unknown name."""
    entry = find_recipe(name).entry
    return dataclasses.replace(entry, default_dims=dict(entry.default_dims))


def get_model_path(name: str, *, rebuild: bool = False) -> Path:
    """The ``.onnx`` file of zoo model ``name``, building it into :func:`zoo_cache_dir` if needed.

    Names are case-insensitive and may carry a ``zoo:`` prefix. The file is written atomically, so
    processes that race to build the same model each see a complete file. ``rebuild=True`` builds again
    even when a cached file exists.
    """
    entry = find_recipe(name).entry
    path = cached_model_path(entry.name)
    if path.is_file() and not rebuild:
        return path
    return save_atomically(build_model_bytes(entry.name), path)


def export_model(name: str, dest: str | Path) -> Path:
    """Write zoo model ``name`` to the file ``dest`` (parent folders are created) and return its path.

    If ``dest`` is an existing directory the file is ``dest/<name>.onnx``.
    """
    source = get_model_path(name)
    dest = Path(dest).expanduser()
    if dest.is_dir():
        dest = dest / f"{find_recipe(name).entry.name}.onnx"
    return copy_atomically(source, dest)
