"""onnxaccel: take an ONNX model to fast, correct inference on AMD, NVIDIA and CPU.

The public API is three nouns (docs/ARCHITECTURE.md, "Layers"): a :class:`Model`, a :class:`Target` and a
Runner compiled from the two by an engine. Importing this package loads nothing but its version: each public
name is imported on first use (PEP 562), so ``onnxaccel --help`` and ``import onnxaccel`` stay fast; ``Model``
brings onnx and numpy, and ONNX Runtime and every hardware library are imported where they are used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnxaccel.errors import OnnxAccelError
    from onnxaccel.model import Model, TensorSpec, load_model
    from onnxaccel.target import Target, parse_target

__version__ = "0.1.0"

__all__ = [
    "Model",
    "OnnxAccelError",
    "Target",
    "TensorSpec",
    "__version__",
    "load_model",
    "parse_target",
]

#: Public name -> the module that defines it (imported on first use).
_LAZY = {
    "Model": "onnxaccel.model",
    "OnnxAccelError": "onnxaccel.errors",
    "Target": "onnxaccel.target",
    "TensorSpec": "onnxaccel.model",
    "load_model": "onnxaccel.model",
    "parse_target": "onnxaccel.target",
}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use and kept here (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the public ones not yet imported included."""
    return sorted({*globals(), *__all__})
