"""Fix symbolic dimensions to static values (``--fix-shape``).

Compiling providers build one program per input shape: MIGraphX recompiles (or loads another .mxr) for every new
shape and its compile time grows with the maximum dynamic dimension (microsoft/onnxruntime
onnxruntime/core/providers/migraphx/migraphx_execution_provider.cc at 03c1250; ROCm/AMDMIGraphX#4846), so a model
served at one shape should say so. This uses ONNX Runtime's own helpers
(``onnxruntime.tools.onnx_model_utils.make_input_shape_fixed``, which replaces a dim_param everywhere it occurs,
and ``fix_output_shapes``), then re-infers intermediate shapes.
"""

from __future__ import annotations

import onnx

from onnxaccel.errors import MissingDependencyError, ShapeError
from onnxaccel.model import Model


def fix_shapes(proto: onnx.ModelProto, bound: Model) -> tuple[onnx.ModelProto, dict[str, list[int]]]:
    """Stamp every input of ``proto`` with the concrete shape ``bound`` gives it (see ``Model.bind``).

    Returns the new proto and the shapes it now has. Graph outputs and intermediate value_info are
    re-inferred, so downstream tools (and compiling providers) see static shapes throughout.
    """
    try:
        from onnxruntime.tools.onnx_model_utils import fix_output_shapes, make_input_shape_fixed
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "cpu", "Fixing input shapes") from exc
    if not bound.is_bound:
        bound = bound.bind()
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    fixed = {}
    for spec in bound.inputs:
        shape = list(bound.input_shapes[spec.name])
        try:
            make_input_shape_fixed(copy.graph, spec.name, shape)
        except ValueError as exc:
            raise ShapeError(f"Cannot fix input '{spec.name}' to {shape}: {exc}",
                             f"Give a shape that matches its fixed dims {spec.shape_text()}.") from exc
        fixed[spec.name] = shape
    # Old value_info may still carry the symbolic dims (or -1); drop it and infer again.
    del copy.graph.value_info[:]
    try:
        copy = onnx.shape_inference.infer_shapes(copy, data_prop=True)
        fix_output_shapes(copy)
    except Exception:  # noqa: BLE001 - inference is best effort; the inputs are fixed either way
        pass
    return copy, fixed


def symbolic_dims(proto: onnx.ModelProto) -> list[str]:
    """dim_param names (and '?' for unknown dims) still on the graph inputs."""
    initializers = {t.name for t in proto.graph.initializer}
    found = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value") or dim.dim_value <= 0:
                found.append(dim.dim_param or "?")
    return found
