"""onnxaccel: take an ONNX model to fast, correct inference on AMD, NVIDIA and CPU.

The public API is three nouns (docs/ARCHITECTURE.md, "Layers"): a :class:`Model`, a :class:`Target` and a
Runner compiled from the two by an engine. Importing this package loads only onnx and numpy; ONNX Runtime and every
hardware library are imported where they are used.
"""

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
