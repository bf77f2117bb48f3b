"""How a model's output sizes follow from its input dims, so shape buckets crop an output back to the length the
unpadded input gives even where that length is not the input dim itself: the PP-OCR recognizer's x[N,3,48,W] gives
[N, W/8, 6625], and a row 192 wide padded to a 256 bucket comes back with 24 steps, not 32.

ONNX Runtime's symbolic shape inference (``onnxruntime.tools.symbolic_shape_infer``, with sympy) gives each output
axis as an expression of the input dim_params, e.g. ``floor(floor(floor(W/2 - 1/2)/2)/2 - 1/2) + 1`` for the
recognizer. It runs once per model file (kept with its facts, onnxaccel.model_memo); :mod:`onnxaccel.engines.buckets`
checks an expression against the bucket's own output before it trusts it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

from onnxaccel.model import Model

_KNOWN: dict[str, dict] = {}


def output_dims(model: Model) -> dict:
    """How the outputs' sizes follow from the input dims: ``{"symbols": [dim_param, ...], "outputs": {name: {axis:
    expression}}}``, each expression (sympy text) in ``_d0``, ``_d1``... (the symbols in order) and listed only where
    it depends on input dims alone; {} where inference cannot run. Worked out once per model file."""
    from onnxaccel import model_memo

    key = model.cache_key()
    if key not in _KNOWN:
        kept = model_memo.facts(model.path).get("output_dims")
        if kept is None:
            kept = _infer(model)
            model_memo.remember(model.path, output_dims=kept)
        _KNOWN[key] = kept
    return _KNOWN[key]


def output_length(model: Model, output: str, axis: int, dims: Mapping[str, int]) -> int | None:
    """The length of ``output``'s ``axis`` when the input dim_params have the values ``dims``; None where its
    expression is unknown or needs a dim ``dims`` does not give."""
    known = output_dims(model)
    expression = known.get("outputs", {}).get(output, {}).get(str(axis))
    if expression is None:
        return None
    return _evaluate(expression, tuple((f"_d{i}", dims.get(n)) for i, n in enumerate(known["symbols"])))


def _infer(model: Model) -> dict:
    """Symbolic shape inference over a light copy of the graph (large weights as shaped inputs)."""
    try:
        import onnx
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError:
        return {}
    src, symbols = model.proto, []
    graph = onnx.GraphProto(name=src.graph.name, node=src.graph.node, output=src.graph.output)
    light = onnx.ModelProto(ir_version=src.ir_version, opset_import=src.opset_import, functions=src.functions,
                            graph=graph)
    initializers = {t.name for t in src.graph.initializer}
    for value in (v for v in src.graph.input if v.name not in initializers):
        copy = light.graph.input.add()
        copy.CopyFrom(value)
        for dim in copy.type.tensor_type.shape.dim:  # dim_params as symbols sympy reads (p2o.DynamicDimension.1)
            if dim.HasField("dim_param"):
                symbols += [] if dim.dim_param in symbols else [dim.dim_param]
                dim.dim_param = f"_d{symbols.index(dim.dim_param)}"
    for tensor in src.graph.initializer:  # only their shapes matter here, and small values (Reshape's shapes)
        if int(np.prod(tensor.dims)) <= 4096 and not onnx.external_data_helper.uses_external_data(tensor):
            light.graph.initializer.append(tensor)
        else:
            light.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    try:  # its infer_shapes wrapper writes a file into the working directory when incomplete: the same steps
        inference = SymbolicShapeInference(2**31 - 1, True, False, 0)  # int_max, auto_merge, guess_output_rank
        inference._preprocess(light)
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
    except Exception:  # noqa: BLE001 - it asserts on ops it does not know: no relation is known then
        return {}
    names = {f"_d{i}" for i in range(len(symbols))}
    outputs = {}
    for out in inference.out_mp_.graph.output:
        axes = {str(axis): d.dim_param or str(d.dim_value) for axis, d in enumerate(out.type.tensor_type.shape.dim)
                if d.HasField("dim_value") or _in(d.dim_param, names)}
        outputs[out.name] = axes
    return {"symbols": symbols, "outputs": outputs}


def _in(expression: str, names: set[str]) -> bool:
    """Whether ``expression`` depends on ``names`` alone (not on a size inference made up inside the graph)."""
    import sympy

    try:
        return {str(s) for s in sympy.sympify(expression).free_symbols} <= names
    except Exception:  # noqa: BLE001 - a made-up symbol sympy cannot read (a node name with '/')
        return False


@functools.lru_cache(maxsize=4096)
def _evaluate(expression: str, values: tuple[tuple[str, int | None], ...]) -> int | None:
    """``expression`` at ``values``; None unless that is an integer."""
    import sympy

    found = sympy.sympify(expression).subs({sympy.Symbol(k): v for k, v in values if v is not None})
    return int(found) if found.is_Integer else None
