"""Preprocessing inside the graph: the model takes uint8 NHWC pixels and does the cast, scale, mean/std and the
transpose to NCHW as ONNX ops on the device (``optimize --embed-preprocess imagenet|yolo|scale01``).

Why: fed FP32 NCHW tensors, a client or batch job does per-pixel float work in Python and moves 4 bytes a
pixel to the device; fed uint8 pixels (what a decoder gives), it moves 1 byte a pixel and the arithmetic runs
as three elementwise ops and a transpose next to the model. The geometry (resize, crop, letterbox) stays
outside, where the decoder does it at reduced size. Only standard ONNX ops (Transpose, Cast, Mul, Add) are
added, so every provider runs it (MIGraphX parses all four: AMDMIGraphX src/onnx parse_transpose.cpp,
parse_cast.cpp, and the binary ops in parse_generic_op/parse_binary_op; never executed here on AMD hardware).

The folded arithmetic: (x * scale - mean) / std == x * (scale / std) + (-mean / std), per channel.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxaccel import providers
from onnxaccel.errors import ModelError, UsageError
from onnxaccel.plan import EMBEDDABLE  # the plan decides what is embedded; this module embeds it
from onnxaccel.precision.checkpoint import save_model
from onnxaccel.prepost.presets import preset_values

#: ONNX Runtime's name for the CPU provider (from the registry: only providers/ and engines/ spell it).
_CPU = providers.get("cpu").provider

#: Metadata key recording what was embedded (read by run/serve/batch to feed uint8 pixels).
META_EMBEDDED = "onnxaccel.embedded_preprocess"


@dataclass(frozen=True)
class EmbeddedPreprocess:
    """What ``embed_preprocess`` put in the graph: the input it changed, the preset and its values."""

    input: str
    preset: str
    scale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    float_type: str

    def to_dict(self) -> dict:
        """JSON-ready (also the metadata value)."""
        return {"input": self.input, "preset": self.preset, "scale": self.scale, "mean": list(self.mean),
                "std": list(self.std), "layout": "NHWC", "dtype": "uint8", "float_type": self.float_type}

    def describe(self) -> str:
        """One line for reports."""
        return (f"input '{self.input}' takes uint8 NHWC pixels; in the graph: Transpose to NCHW, Cast to "
                f"{self.float_type}, x*{self.scale:g} - mean {list(self.mean)} / std {list(self.std)} ({self.preset})")


def embed_preprocess(proto: onnx.ModelProto, preset: str, *, input_name: str | None = None,
                     mean: tuple[float, ...] | None = None, std: tuple[float, ...] | None = None
                     ) -> tuple[onnx.ModelProto, EmbeddedPreprocess]:
    """A copy of ``proto`` whose image input takes uint8 [N, H, W, 3] pixels, preprocessed in the graph."""
    if preset not in EMBEDDABLE:
        raise UsageError(f"--embed-preprocess must be one of {', '.join(EMBEDDABLE)}, got '{preset}'.",
                         "imagenet: /255, ImageNet mean/std; yolo and scale01: /255.")
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    graph = model.graph
    if any(p.key == META_EMBEDDED for p in model.metadata_props):
        raise UsageError("The model already has its preprocessing embedded.", "Embed it once, into the original model.")
    initializers = {i.name for i in graph.initializer}
    image = _image_input(graph, initializers, input_name)
    tensor = image.type.tensor_type
    float_type = tensor.elem_type
    dims = list(tensor.shape.dim)
    scale, mean_v, std_v = preset_values(preset)
    mean_v, std_v = mean or mean_v, std or std_v
    np_float = helper.tensor_dtype_to_np_dtype(float_type)
    name = image.name
    inner = _unique(graph, f"{name}_nchw")
    mul = numpy_helper.from_array((scale / np.asarray(std_v, np.float64)).astype(np_float).reshape(1, 3, 1, 1),
                                  _unique(graph, f"{name}_scale_over_std"))
    add = numpy_helper.from_array((-np.asarray(mean_v, np.float64) / np.asarray(std_v, np.float64))
                                  .astype(np_float).reshape(1, 3, 1, 1), _unique(graph, f"{name}_minus_mean_over_std"))
    names = [_unique(graph, f"{name}_{s}") for s in ("transposed", "float", "scaled")]
    nodes = [
        helper.make_node("Transpose", [name], [names[0]], perm=[0, 3, 1, 2], name=names[0]),
        helper.make_node("Cast", [names[0]], [names[1]], to=float_type, name=names[1]),
        helper.make_node("Mul", [names[1], mul.name], [names[2]], name=names[2]),
        helper.make_node("Add", [names[2], add.name], [inner], name=inner),
    ]
    for node in _all_nodes(graph):
        node.input[:] = [inner if i == name else i for i in node.input]
    for output in graph.output:
        if output.name == name:
            raise UsageError(f"Input '{name}' is also a graph output; cannot embed preprocessing in front of it.",
                             "Embed into a model whose image input feeds nodes only.")
    graph.initializer.extend([mul, add])
    for node in reversed(nodes):
        graph.node.insert(0, node)
    nhwc = [dims[0], dims[2], dims[3], dims[1]]
    tensor.elem_type = TensorProto.UINT8
    tensor.shape.ClearField("dim")
    for dim in nhwc:
        tensor.shape.dim.add().CopyFrom(dim)
    done = EmbeddedPreprocess(name, preset, float(scale), tuple(float(v) for v in mean_v),
                              tuple(float(v) for v in std_v), TensorProto.DataType.Name(float_type).lower())
    model.metadata_props.add(key=META_EMBEDDED, value=json.dumps(done.to_dict()))
    return model, done


def embedded_of(proto: onnx.ModelProto) -> EmbeddedPreprocess | None:
    """What a model has embedded, read from its metadata; None if nothing."""
    for prop in proto.metadata_props:
        if prop.key == META_EMBEDDED:
            data = json.loads(prop.value)
            return EmbeddedPreprocess(data["input"], data["preset"], data["scale"], tuple(data["mean"]),
                                      tuple(data["std"]), data.get("float_type", "float"))
    return None


def _image_input(graph: onnx.GraphProto, initializers: set[str], wanted: str | None) -> onnx.ValueInfoProto:
    """The input to embed in front of: ``wanted``, or the only rank-4 float input with 3 channels on axis 1."""
    candidates = []
    for value in graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = tensor.shape.dim if tensor.HasField("shape") else []
        is_image = (tensor.elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
                    and len(dims) == 4 and dims[1].HasField("dim_value") and dims[1].dim_value == 3)
        if wanted is None and is_image:
            candidates.append(value)
        elif value.name == wanted:
            if not is_image:
                raise UsageError(f"Input '{wanted}' is not a float NCHW image input with 3 channels.",
                                 "Embedding needs an input [N, 3, H, W] of float, float16 or bfloat16.")
            return value
    if wanted is not None:
        raise UsageError(f"The model has no input '{wanted}'.",
                         f"Its inputs: {', '.join(v.name for v in graph.input if v.name not in initializers)}.")
    if len(candidates) != 1:
        raise UsageError(f"The model has {len(candidates)} float NCHW 3-channel inputs; embedding needs exactly one.",
                         "Name it: --embed-input NAME." if candidates else "Embedding is for image models.")
    return candidates[0]


def _all_nodes(graph: onnx.GraphProto):
    """Every node, subgraphs (If/Loop/Scan bodies) included: they may read the input by name too."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _all_nodes(sub)


def _unique(graph: onnx.GraphProto, base: str) -> str:
    """A value name not used in the graph yet."""
    used = {i.name for i in graph.initializer} | {v.name for v in graph.input} | {
        o for n in graph.node for o in n.output}
    name, k = base, 1
    while name in used:
        name, k = f"{base}_{k}", k + 1
    return name


def embed_into_file(path, preset: str, *, input_name: str | None = None, seed: int = 0
                    ) -> tuple[EmbeddedPreprocess, float]:
    """Embed ``preset`` into the model at ``path`` (rewritten in place, checked with onnx's full check) and prove
    it: the embedded model fed random uint8 pixels must equal the model before, fed the same pixels
    preprocessed on the host (cast, scale, mean/std, NHWC -> NCHW), on ONNX Runtime's CPU provider. Returns what
    was embedded and the largest absolute difference; an error if they differ beyond float tolerance."""
    path = Path(path)
    before = onnx.load(str(path))
    after, done = embed_preprocess(before, preset, input_name=input_name)
    onnx.checker.check_model(after, full_check=True)
    image = next(v for v in after.graph.input if v.name == done.input)
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (1 if i == 0 else 32)
            for i, d in enumerate(image.type.tensor_type.shape.dim)]
    pixels = np.random.default_rng(seed).integers(0, 256, dims, dtype=np.uint8)
    host = ((pixels.astype(np.float64) * done.scale - np.asarray(done.mean)) / np.asarray(done.std)
            ).transpose(0, 3, 1, 2).astype(helper.tensor_dtype_to_np_dtype(
                getattr(TensorProto, done.float_type.upper())))
    initializers = {i.name for i in before.graph.initializer}
    others = [v.name for v in before.graph.input if v.name != done.input and v.name not in initializers]
    if others:
        raise UsageError(f"The model has inputs besides the image ({', '.join(others)}); --embed-preprocess checks "
                         "its result on models whose only input is the image.", "Embed into the image model alone.")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    want = ort.InferenceSession(before.SerializeToString(), options, providers=[_CPU]).run(
        None, {done.input: host})
    got = ort.InferenceSession(after.SerializeToString(), options, providers=[_CPU]).run(
        None, {done.input: pixels})
    worst = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if np.size(a) else 0.0
                for a, b in zip(got, want))
    scale = max(float(np.max(np.abs(np.asarray(b, np.float64)))) if np.size(b) else 0.0 for b in want)
    if worst > 1e-3 * max(1.0, scale):
        raise ModelError(f"Embedding {preset} preprocessing changed the outputs (max |diff| {worst:.3g}); "
                         "the model was left as it was.", "Report this with the model: it is a bug.")
    save_model(after, path, converter=f"optimize --embed-preprocess {preset}")
    return done, worst


def embedded_copy(model, preset: str) -> str:
    """The model with ``preset`` preprocessing embedded: ``<cache>/embedded/<model key>-<preset>.onnx``, made
    once (atomically) and checked against host preprocessing by embed_into_file. A model that has this preset
    embedded already is returned as is; another preset is an error. What `batch --embed-preprocess` runs, and
    `batch`/`serve` on a GPU target given an image preset (plan.py embed_preset). With an artifacts directory
    active (engines/artifacts.py), the copy is the directory's (``onnxaccel compile`` put it there). ``model``: a
    path or ``zoo:NAME``, or the Model the caller loaded from it already (read once)."""
    from onnxaccel.engines import artifacts
    from onnxaccel.model import load_model

    source = load_model(model) if isinstance(model, (str, os.PathLike)) else model  # a Model loaded already
    already = embedded_of(source.proto)
    if already is not None:
        if already.preset != preset:
            raise UsageError(f"The model has {already.preset} preprocessing embedded; --embed-preprocess {preset} "
                             "cannot apply on top of it.", f"Drop --embed-preprocess (it runs {already.preset}), "
                             "or pass the model without embedded preprocessing.")
        return source.source
    store = artifacts.active()
    if store is not None:
        return store.embedded(source, preset, lambda: _embedded_in_cache(source, preset))
    return _embedded_in_cache(source, preset)


def _embedded_in_cache(source, preset: str) -> str:
    """``source`` with ``preset`` embedded, made once under ``<cache>/embedded``."""
    import os
    import tempfile

    from onnxaccel.paths import cache_root

    folder = cache_root() / "embedded"
    path = folder / f"{source.cache_key()}-{preset}.onnx"
    if path.is_file():
        return str(path)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=folder)
    os.close(fd)
    try:
        onnx.save(source.proto, tmp)
        embed_into_file(tmp, preset)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return str(path)
