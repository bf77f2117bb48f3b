"""Simplification and constant folding with onnxslim (a maintained successor of onnx-simplifier).

``onnxslim.slim(model_proto, ...)`` folds constants, removes dead and duplicate nodes and applies pattern
fusions (Conv+BN, Gemm, Pad+Conv, Reshape/Transpose chains), returning a new ModelProto (onnxslim 0.1.98,
``onnxslim/cli/_main.py``). It prints a summary table, which is kept out of our output.
"""

from __future__ import annotations

import contextlib
import io

import onnx

from onnxaccel.errors import MissingDependencyError, ModelError


def simplify(proto: onnx.ModelProto, *, skip_fusions: bool = False) -> onnx.ModelProto:
    """Return an onnxslim-simplified copy of ``proto`` (weights loaded); metadata is kept."""
    try:
        import onnxslim
    except ImportError as exc:
        raise MissingDependencyError("onnxslim", "optimize", "Simplifying the graph (--simplify)") from exc
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    kwargs = {"model_check": False}
    if skip_fusions:
        kwargs["skip_optimizations"] = ["graph_fusion"]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            slimmed = onnxslim.slim(copy, **kwargs)
    except Exception as exc:  # noqa: BLE001 - onnxslim raises plain exceptions on graphs it cannot handle
        raise ModelError(f"onnxslim could not simplify the model: {type(exc).__name__}: {exc}",
                         "Run without --simplify; graph optimization by ONNX Runtime still applies.",
                         details=repr(exc)) from exc
    if slimmed is None:
        raise ModelError("onnxslim returned no model.", "Run without --simplify.")
    del slimmed.metadata_props[:]
    slimmed.metadata_props.extend(proto.metadata_props)
    return slimmed
