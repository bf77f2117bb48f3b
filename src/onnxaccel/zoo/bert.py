"""A BERT encoder built node by node in the shape that PyTorch exports Hugging Face's ``BertModel``.

The graph follows the TorchScript exporter's output for ``transformers.BertModel`` at opset 17 (with
constant folding), because ONNX Runtime's transformer optimizer (``onnxruntime.transformers.optimizer``,
``model_type="bert"``) recognizes models by matching exactly those node patterns
(``fusion_attention.py``, ``fusion_embedlayer.py``, ``fusion_gelu.py`` in onnxruntime 1.32):

- embeddings: ``Add(Add(Gather(word), Gather(token_type)), Gather(position))`` with the position ids
  ``Slice``d from a ``[1, max_positions]`` constant up to ``Shape(input_ids)[1]``, then
  ``LayerNormalization``;
- the extended mask ``(1 - Cast(Unsqueeze(Unsqueeze(mask, 1), 2))) * -10000``, computed once;
- per layer: Q, K, V as ``MatMul`` + ``Add``; ``Reshape [0, 0, heads, head_size]``; ``Transpose``
  (K straight to ``[0, 2, 3, 1]``, as the exporter merges the two transposes); ``MatMul``; ``Div`` by
  sqrt(head_size); ``Add`` mask; ``Softmax``; ``MatMul`` V; ``Transpose``; ``Reshape [0, 0, hidden]``;
  output ``MatMul`` + ``Add``; residual ``Add``; ``LayerNormalization``; feed-forward with exact-erf GELU
  ``x * 0.5 * (1 + Erf(x / sqrt(2)))``; residual ``Add``; ``LayerNormalization``;
- pooler: token 0 (``Gather`` axis 1), ``MatMul`` + ``Add``, ``Tanh``.

Weights are N(0, 0.02) as in ``BertPreTrainedModel._init_weights``; biases 0; LayerNorm gamma 1, beta 0.
Linear weights are stored ``[in, out]``, as the exporter writes them for ``MatMul``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxaccel.zoo.finish import set_default_opset

OPSET = 17
INIT_STD = 0.02
MASK_FILL = -10000.0  # Hugging Face BERT's extended-mask fill before transformers 4.21 switched to finfo.min


@dataclass(frozen=True)
class BertConfig:
    """Size of a BERT encoder built by the zoo."""
    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int = 30522
    max_positions: int = 512
    type_vocab: int = 2
    layer_norm_eps: float = 1e-12

    @property
    def head_size(self) -> int:
        """Hidden size per attention head."""
        return self.hidden // self.heads

    def parameter_count(self) -> int:
        """Learnable parameters, the same count ``BertModel(config).num_parameters()`` reports."""
        h, i = self.hidden, self.intermediate
        embeddings = (self.vocab + self.max_positions + self.type_vocab) * h + 2 * h
        attention = 4 * (h * h + h) + 2 * h
        feed_forward = (h * i + i) + (i * h + h) + 2 * h
        pooler = h * h + h
        return embeddings + self.layers * (attention + feed_forward) + pooler


BERT_BASE = BertConfig(layers=12, hidden=768, heads=12, intermediate=3072)
BERT_TINY = BertConfig(layers=2, hidden=128, heads=2, intermediate=512)


class _GraphWriter:
    """Collects nodes and initializers; names follow the exporter's ``/module/path/OpType`` scheme."""

    def __init__(self, rng: np.random.Generator, graph: onnx.GraphProto):
        self.rng = rng
        self.graph = graph  # the model's own graph: tensors are written once, never copied
        self._names: dict[str, int] = {}  # node name -> how many nodes already use it
        self._ints: set[str] = set()

    def op(self, op_type: str, inputs: list[str], scope: str, output: str | None = None, **attrs) -> str:
        name = f"{scope}/{op_type}"
        count = self._names.get(name, 0)
        self._names[name] = count + 1
        if count:
            name = f"{name}_{count}"
        output = output or f"{name}_output_0"
        self.graph.node.append(helper.make_node(op_type, inputs, [output], name=name, **attrs))
        return output

    def scalar(self, value: float, scope: str) -> str:
        """A float scalar as a Constant node (a constant, not a parameter)."""
        tensor = numpy_helper.from_array(np.array(value, dtype=np.float32))
        return self.op("Constant", [], scope, value=tensor)

    def ints(self, name: str, values: list[int] | int) -> str:
        """An int64 initializer (shapes, axes, indices)."""
        if name not in self._ints:
            self._ints.add(name)
            self.graph.initializer.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
        return name

    def weight(self, name: str, shape: tuple[int, ...], fill: float | None = None) -> str:
        """A float parameter: N(0, INIT_STD) drawn in creation order, or a constant ``fill``."""
        if fill is None:
            values = self.rng.standard_normal(shape, dtype=np.float32)
            values *= np.float32(INIT_STD)
        else:
            values = np.full(shape, fill, dtype=np.float32)
        tensor = self.graph.initializer.add(name=name, data_type=TensorProto.FLOAT, dims=shape)
        tensor.raw_data = values.astype("<f4", copy=False).tobytes()  # ONNX raw_data is little-endian
        return name

    def linear(self, x: str, module: str, d_in: int, d_out: int) -> str:
        """``MatMul`` + ``Add(bias, ·)``, the exporter's form of ``nn.Linear`` on a 3-D input."""
        mm = self.op("MatMul", [x, self.weight(f"{module}.weight", (d_in, d_out))], f"/{module.replace('.', '/')}")
        bias = self.weight(f"{module}.bias", (d_out,), fill=0.0)
        return self.op("Add", [bias, mm], f"/{module.replace('.', '/')}")

    def layer_norm(self, x: str, module: str, hidden: int, eps: float, output: str | None = None) -> str:
        gamma = self.weight(f"{module}.weight", (hidden,), fill=1.0)
        beta = self.weight(f"{module}.bias", (hidden,), fill=0.0)
        return self.op(
            "LayerNormalization", [x, gamma, beta], f"/{module.replace('.', '/')}", output, axis=-1, epsilon=eps
        )


def build_bert(config: BertConfig, seed: int) -> onnx.ModelProto:
    """The encoder as an opset-17 ``ModelProto`` (IR 8); metadata is left to the caller."""
    model = onnx.ModelProto()
    g = _GraphWriter(np.random.default_rng(seed), model.graph)
    hidden_states = _embeddings(g, config)
    mask = _extended_mask(g)
    for index in range(config.layers):
        hidden_states = _layer(g, config, index, hidden_states, mask, last=index == config.layers - 1)
    first_token = g.op("Gather", [hidden_states, g.ints("pooler.first_token_index", 0)], "/pooler", axis=1)
    dense = g.linear(first_token, "pooler.dense", config.hidden, config.hidden)
    g.op("Tanh", [dense], "/pooler/activation", output="pooler_output")

    ids = ["batch", "sequence"]
    graph = g.graph
    graph.name = "bert"
    graph.input.extend(
        helper.make_tensor_value_info(name, TensorProto.INT64, ids)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    )
    graph.output.extend(
        [
            helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [*ids, config.hidden]),
            helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, ["batch", config.hidden]),
        ]
    )
    set_default_opset(model, OPSET)
    return model


def _embeddings(g: _GraphWriter, config: BertConfig) -> str:
    scope = "/embeddings"
    word_table = g.weight("embeddings.word_embeddings.weight", (config.vocab, config.hidden))
    type_table = g.weight("embeddings.token_type_embeddings.weight", (config.type_vocab, config.hidden))
    words = g.op("Gather", [word_table, "input_ids"], f"{scope}/word_embeddings")
    types = g.op("Gather", [type_table, "token_type_ids"], f"{scope}/token_type_embeddings")
    summed = g.op("Add", [words, types], scope)
    # position_ids = self.position_ids[:, :seq_length]: Shape -> Gather(1) -> Unsqueeze -> Slice, the path
    # FusionEmbedLayerNormalization.match_position_embedding_bert expects.
    seq_len = g.op("Gather", [g.op("Shape", ["input_ids"], scope), g.ints("embeddings.seq_axis", 1)], scope, axis=0)
    seq_end = g.op("Unsqueeze", [seq_len, g.ints("embeddings.axes_0", [0])], scope)
    position_ids = g.ints("embeddings.position_ids", [list(range(config.max_positions))])
    sliced = g.op(
        "Slice",
        [
            position_ids,
            g.ints("embeddings.zero", [0]),
            seq_end,
            g.ints("embeddings.axes_1", [1]),
            g.ints("embeddings.one", [1]),
        ],
        scope,
    )
    position_table = g.weight("embeddings.position_embeddings.weight", (config.max_positions, config.hidden))
    positions = g.op("Gather", [position_table, sliced], f"{scope}/position_embeddings")
    embedded = g.op("Add", [summed, positions], scope)
    return g.layer_norm(embedded, "embeddings.LayerNorm", config.hidden, config.layer_norm_eps)


def _extended_mask(g: _GraphWriter) -> str:
    """``(1.0 - attention_mask[:, None, None, :].float()) * -10000.0`` -> [batch, 1, 1, sequence]."""
    scope = ""
    unsqueezed = g.op("Unsqueeze", ["attention_mask", g.ints("mask.axes_1", [1])], scope)
    unsqueezed = g.op("Unsqueeze", [unsqueezed, g.ints("mask.axes_2", [2])], scope)
    as_float = g.op("Cast", [unsqueezed], scope, to=TensorProto.FLOAT)
    inverted = g.op("Sub", [g.scalar(1.0, scope), as_float], scope)
    return g.op("Mul", [inverted, g.scalar(MASK_FILL, scope)], scope)


def _layer(g: _GraphWriter, config: BertConfig, index: int, x: str, mask: str, *, last: bool) -> str:
    module = f"encoder.layer.{index}"
    scope = f"/encoder/layer.{index}/attention/self"
    heads_shape = g.ints("shape.heads", [0, 0, config.heads, config.head_size])

    def heads(name: str, perm: list[int]) -> str:
        projected = g.linear(x, f"{module}.attention.self.{name}", config.hidden, config.hidden)
        return g.op("Transpose", [g.op("Reshape", [projected, heads_shape], scope)], scope, perm=perm)

    query = heads("query", [0, 2, 1, 3])
    key_t = heads("key", [0, 2, 3, 1])  # key.transpose(-1, -2) folded into the head transpose
    value = heads("value", [0, 2, 1, 3])
    scores = g.op("MatMul", [query, key_t], scope)
    scores = g.op("Div", [scores, g.scalar(float(np.sqrt(config.head_size)), scope)], scope)
    scores = g.op("Add", [scores, mask], scope)
    probs = g.op("Softmax", [scores], scope, axis=-1)
    context = g.op("MatMul", [probs, value], scope)
    context = g.op("Transpose", [context], scope, perm=[0, 2, 1, 3])
    context = g.op("Reshape", [context, g.ints("shape.hidden", [0, 0, config.hidden])], scope)

    attn_out = g.linear(context, f"{module}.attention.output.dense", config.hidden, config.hidden)
    attn_out = g.op("Add", [attn_out, x], f"/encoder/layer.{index}/attention/output")
    attn_out = g.layer_norm(attn_out, f"{module}.attention.output.LayerNorm", config.hidden, config.layer_norm_eps)

    inner = g.linear(attn_out, f"{module}.intermediate.dense", config.hidden, config.intermediate)
    inner = _gelu(g, inner, f"/encoder/layer.{index}/intermediate/intermediate_act_fn")
    out = g.linear(inner, f"{module}.output.dense", config.intermediate, config.hidden)
    out = g.op("Add", [out, attn_out], f"/encoder/layer.{index}/output")
    return g.layer_norm(
        out,
        f"{module}.output.LayerNorm",
        config.hidden,
        config.layer_norm_eps,
        output="last_hidden_state" if last else None,
    )


def _gelu(g: _GraphWriter, x: str, scope: str) -> str:
    """``x * 0.5 * (1.0 + erf(x / sqrt(2.0)))``, transformers' ``GELUActivation`` (exact form)."""
    half = g.op("Mul", [x, g.scalar(0.5, scope)], scope)
    erf = g.op("Erf", [g.op("Div", [x, g.scalar(float(np.sqrt(2.0)), scope)], scope)], scope)
    return g.op("Mul", [half, g.op("Add", [erf, g.scalar(1.0, scope)], scope)], scope)
