"""Full-size CNNs from the light copies of the ONNX model zoo that ship inside the ``onnx`` package.

``onnx/backend/test/data/light/light_<name>.onnx`` keeps each architecture but replaces every large
weight by ``ConstantOfShape(<weight>__SHAPE)`` (value 0.02) so the file stays small. Those files are
IR 3 / opset 9 with a fixed batch of 1. :func:`build_light_cnn` turns one into a usable model:

1. upgrade to opset 17 with ``onnx.version_converter`` (the model keeps its opset if that fails);
2. make the batch dimension symbolic, including ``Reshape`` constants that pin it to 1;
3. replace every weight by seeded random values scaled for how the tensor is consumed, so activations
   stay moderate (below about 1e4) in FP32 and FP16 and different inputs give different predictions.

The light files also carry a few real trained tensors (mostly BatchNormalization statistics); mixed with
random convolutions they are meaningless and some are unsafe (variances of 1e-12), so every float
parameter is re-drawn.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from onnxaccel.errors import ModelNotFoundError
from onnxaccel.zoo.finish import seed_for, set_default_opset

TARGET_OPSET = 17
BATCH_DIM = "batch"

# Variance gain that keeps activations at a constant scale through zero-mean filters after a ReLU: a
# ReLU of N(0, v) has variance v * (1/2 - 1/(2*pi)), so the filter needs variance 1 / (0.3408 * fan_in).
_RELU_ZERO_MEAN_GAIN = 1.0 / (0.5 - 0.5 / np.pi)

# Ops through which a weight passes unchanged in meaning on its way to the op that uses it.
_PASS_THROUGH_OPS = ("Unsqueeze", "Reshape")


def light_model_path(light_name: str) -> Path:
    """``<onnx package>/backend/test/data/light/light_<light_name>.onnx``."""
    folder = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
    path = folder / f"light_{light_name}.onnx"
    if not path.is_file():
        raise ModelNotFoundError(
            f"The installed onnx package has no light model '{path.name}' (looked in {path.parent}).",
            "Reinstall onnx from a wheel (pip install --force-reinstall onnx); the zoo CNNs are built "
            "from the test data that the wheel ships.",
        )
    return path


@dataclass
class LightBuild:
    """The rebuilt model and how it went."""

    model: onnx.ModelProto
    opset: int
    upgrade_error: str | None  # why the opset upgrade failed, None when it succeeded


def build_light_cnn(name: str, light_name: str) -> LightBuild:
    """Materialize ``light_<light_name>.onnx`` with weights seeded by ``name``."""
    model, opset, upgrade_error = _upgrade_opset(onnx.load(str(light_model_path(light_name))))
    graph = model.graph
    initializer_names = {init.name for init in graph.initializer}
    real_inputs = [inp for inp in graph.input if inp.name not in initializer_names]
    del graph.input[:]
    graph.input.extend(real_inputs)
    del graph.value_info[:]
    set_default_opset(model, opset)
    _make_batch_dynamic(model)
    _materialize_weights(graph, np.random.default_rng(seed_for(name)))
    return LightBuild(model=model, opset=opset, upgrade_error=upgrade_error)


def _upgrade_opset(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int, str | None]:
    """Convert to opset 17; on failure keep the model and its opset, and return the converter's message."""
    current = next(op.version for op in model.opset_import if op.domain in ("", "ai.onnx"))
    try:
        return onnx.version_converter.convert_version(model, TARGET_OPSET), TARGET_OPSET, None
    except Exception as exc:  # the converter raises RuntimeError or its own ConvertError
        return model, current, f"{type(exc).__name__}: {exc}"


# ----------------------------------------------------------------------------------------------------
# Dynamic batch


def _make_batch_dynamic(model: onnx.ModelProto) -> None:
    """Name dim 0 of every graph input and output "batch", and let Reshapes copy it instead of pinning 1.

    A Reshape constant like ``[1, 2048]`` or shufflenet's ``[1, 4, 28, 56, 56]`` fixes the batch to 1; its
    leading 1 becomes 0 (Reshape copies that dimension from its input) only where shape inference shows
    the data's dim 0 is the batch. A Reshape of a weight (inception_v1 reshapes ``loss3/classifier_w_0``
    to ``[1000, 1024]``) keeps its constant. Each rewrite can expose the batch to the next Reshape
    downstream, so this repeats until nothing changes.
    """
    graph = model.graph
    for value in list(graph.input) + list(graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = BATCH_DIM
    initializers = {init.name: init for init in graph.initializer}
    consumers = _consumers(graph)
    reshapes = [node for node in graph.node if node.op_type == "Reshape" and node.input[1] in initializers]
    while True:
        inferred = onnx.shape_inference.infer_shapes(model)
        leading = {
            info.name: info.type.tensor_type.shape.dim[0]
            for info in inferred.graph.value_info
            if info.type.tensor_type.shape.dim
        }
        leading.update({inp.name: inp.type.tensor_type.shape.dim[0] for inp in graph.input})
        changed = False
        for node in reshapes:
            target = numpy_helper.to_array(initializers[node.input[1]])
            data_dim = leading.get(node.input[0])
            if target[0] == 1 and data_dim is not None and data_dim.dim_param == BATCH_DIM:
                copy = target.copy()
                copy[0] = 0
                name = node.input[1]
                if len(consumers[name]) > 1:  # shared constant: give this Reshape its own
                    name = f"{name}__batch_{node.output[0]}"
                new = numpy_helper.from_array(copy, name)
                if name in initializers:
                    initializers[name].CopyFrom(new)
                else:
                    graph.initializer.append(new)
                    initializers[name] = graph.initializer[-1]
                node.input[1] = name
                changed = True
        if not changed:
            return


# ----------------------------------------------------------------------------------------------------
# Weights


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for node in graph.node:
        for index, name in enumerate(node.input):
            uses[name].append((node, index))
    return uses


def _materialize_weights(graph: onnx.GraphProto, rng: np.random.Generator) -> None:
    """Replace every ConstantOfShape weight and every float initializer used as a parameter by drawn values.

    Tensors are drawn in graph order from one generator, so the result depends only on the seed.
    """
    initializers = {init.name: init for init in graph.initializer}
    consumers = _consumers(graph)
    weight_shapes: dict[str, tuple[int, ...]] = {}
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in initializers:
            dims = numpy_helper.to_array(initializers[node.input[0]])
            weight_shapes[node.output[0]] = tuple(int(d) for d in dims)
    for name, init in initializers.items():
        if init.data_type == onnx.TensorProto.FLOAT and name in consumers:
            weight_shapes[name] = tuple(init.dims)

    residual_ends = _residual_branch_ends(graph)
    uses = {
        name: _final_use(name, shape, consumers, initializers, residual_ends) for name, shape in weight_shapes.items()
    }

    shape_inputs = {node.input[0] for node in graph.node if node.op_type == "ConstantOfShape"}
    kept_nodes = [node for node in graph.node if node.op_type != "ConstantOfShape"]
    used = {name for node in kept_nodes for name in node.input}
    kept_inits = []  # the small int64 Reshape shapes
    for name, init in initializers.items():
        if name in used and name not in weight_shapes and name not in shape_inputs:
            kept_inits.append(onnx.TensorProto())
            kept_inits[-1].CopyFrom(init)
    del graph.node[:]
    graph.node.extend(kept_nodes)
    del graph.initializer[:]

    # Each tensor goes into the graph as soon as it is drawn, so at most one weight exists twice in memory.
    for node in kept_nodes:
        for name in node.input:
            if name in uses:
                values = _draw(rng, weight_shapes[name], uses.pop(name))
                tensor = graph.initializer.add()
                tensor.name = name
                tensor.data_type = onnx.TensorProto.FLOAT
                tensor.dims.extend(values.shape)
                tensor.raw_data = values.astype("<f4", copy=False).tobytes()  # ONNX raw_data is little-endian
    graph.initializer.extend(kept_inits)


def _residual_branch_ends(graph: onnx.GraphProto) -> set[str]:
    """Activations that end a residual branch: the deeper input of an Add/Sum of two activations.

    Depth counts Conv/Gemm nodes on the longest path from the graph input, so at a resnet join the branch
    (three convs) is told from the shortcut (identity, or one projection conv).
    """
    depth = {inp.name: 0 for inp in graph.input}
    ends: set[str] = set()
    for node in graph.node:
        known = [depth[name] for name in node.input if name in depth]
        if not known:
            continue
        for name in node.output:
            depth[name] = max(known) + (node.op_type in ("Conv", "Gemm"))
        joined = [name for name in node.input if name in depth]
        if node.op_type in ("Add", "Sum") and len(joined) == 2 and depth[joined[0]] != depth[joined[1]]:
            ends.add(max(joined, key=depth.__getitem__))
    return ends


@dataclass(frozen=True)
class _Use:
    op: str
    index: int  # which input of ``op`` the weight feeds
    shape: tuple[int, ...]  # the weight's shape where ``op`` reads it
    node: onnx.NodeProto | None
    residual: bool = False  # ``node`` ends a residual branch: its output is added to another activation


def _final_use(
    name: str,
    shape: tuple[int, ...],
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]],
    initializers: dict[str, onnx.TensorProto],
    residual_ends: set[str],
) -> _Use:
    """Follow a weight through Unsqueeze/Reshape to the op that gives it meaning."""
    while consumers.get(name):
        node, index = consumers[name][0]
        if node.op_type not in _PASS_THROUGH_OPS or index != 0:
            return _Use(node.op_type, index, shape, node, node.output[0] in residual_ends)
        if node.op_type == "Reshape" and node.input[1] in initializers:
            shape = _reshaped(shape, [int(v) for v in numpy_helper.to_array(initializers[node.input[1]])])
        name = node.output[0]
    return _Use("", 0, shape, None)


def _reshaped(shape: tuple[int, ...], target: list[int]) -> tuple[int, ...]:
    """The shape ONNX Reshape (allowzero=0) gives: 0 copies the input dim, -1 takes what is left."""
    dims = [shape[i] if t == 0 else t for i, t in enumerate(target)]
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1]))
        dims[dims.index(-1)] = int(np.prod(shape)) // known
    return tuple(dims)


def _attribute(node: onnx.NodeProto | None, key: str, default: int) -> int:
    for attr in node.attribute if node is not None else ():
        if attr.name == key:
            return onnx.helper.get_attribute_value(attr)
    return default


def _draw(rng: np.random.Generator, shape: tuple[int, ...], use: _Use) -> np.ndarray:
    """Values for one weight, by the role ``use`` gives it.

    The aim is a network whose activations keep a moderate scale from input to output (max |x| of a few
    tens on ImageNet-normalised input, far inside FP16's 65504) and whose prediction depends on the input:

    - Conv and Gemm/MatMul weights are normal with zero-mean filters (see :func:`_zero_mean`); Conv std is
      sqrt(_RELU_ZERO_MEAN_GAIN / fan_in), fully connected std sqrt(1 / fan_in). Biases are 0.
    - BatchNormalization is near identity: scale and running variance U(0.9, 1.1), bias and running mean
      N(0, 0.01). Wider ranges (scale U(0.5, 1), variance U(0.5, 1.5)) make channel scales unequal, and
      through ReLU unequal scales become unequal channel means, an input-independent offset that in
      densenet121 gave every input the same top-1.
    - The BatchNormalization that ends a residual branch gets scale U(0.1, 0.2), so each resnet or
      shufflenet block adds a little to its shortcut instead of doubling its variance (with scale near 1,
      resnet50 reached 2e4 and shufflenet 1e6).
    - densenet's per-channel scale path after BatchNormalization: Mul U(0.9, 1.1), Add N(0, 0.01).
    """

    def normal(std: float) -> np.ndarray:
        values = rng.standard_normal(shape, dtype=np.float32)
        values *= np.float32(std)
        return values

    def uniform(low: float, high: float) -> np.ndarray:
        return rng.uniform(low, high, size=shape).astype(np.float32)

    op, index = use.op, use.index
    if op == "Conv" and index == 1:
        fan_in_axes = tuple(range(1, len(use.shape)))
        fan_in = int(np.prod(use.shape[1:]))
        return _zero_mean(normal(np.sqrt(_RELU_ZERO_MEAN_GAIN / fan_in)), use.shape, fan_in_axes)
    if op in ("Gemm", "MatMul") and index == 1:
        trans_b = _attribute(use.node, "transB", 0) if op == "Gemm" else 0
        fan_in_axis = len(use.shape) - (1 if trans_b else 2)
        return _zero_mean(normal(np.sqrt(1.0 / use.shape[fan_in_axis])), use.shape, (fan_in_axis,))
    if op in ("Conv", "Gemm") and index == 2:
        return np.zeros(shape, dtype=np.float32)
    if op == "BatchNormalization":
        if index == 1:
            return uniform(0.1, 0.2) if use.residual else uniform(0.9, 1.1)
        if index == 4:
            return uniform(0.9, 1.1)
        return normal(0.01)
    if op == "Mul":
        return uniform(0.9, 1.1)
    return normal(0.01)


def _zero_mean(values: np.ndarray, use_shape: tuple[int, ...], fan_in_axes: tuple[int, ...]) -> np.ndarray:
    """Subtract each output unit's mean over its fan-in, in place.

    After a ReLU every channel has a positive mean; a filter whose weights do not sum to zero turns it
    into a large input-independent offset that grows layer by layer until it decides the prediction
    alone (every input gets the same top-1). Zero-mean filters, as in Weight Standardization
    (Qiao et al., 2019, arXiv:1903.10520), cancel that offset.
    """
    view = values.reshape(use_shape)
    view -= view.mean(axis=fan_in_axes, keepdims=True, dtype=np.float64).astype(np.float32)
    return values
