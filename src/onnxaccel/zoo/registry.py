"""The zoo's table of contents: what each model is, and the recipe that builds it."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from onnxaccel.errors import ModelNotFoundError
from onnxaccel.zoo.bert import BERT_BASE, BERT_TINY, BertConfig, build_bert
from onnxaccel.zoo.cnn import build_light_cnn
from onnxaccel.zoo.finish import META_PREPROCESS, seed_for, stamp, validate

ZOO_PREFIX = "zoo:"


@dataclass(frozen=True)
class ZooEntry:
    """One built-in model.

    ``parameters`` is the exact number of elements in the model's float initializers (its weights, and
    for CNNs also BatchNormalization running statistics). ``default_dims`` gives a default size for each
    symbolic dimension other than ``batch``.
    """

    name: str
    description: str
    family: str  # "cnn" or "transformer"
    source: str
    parameters: int
    default_dims: dict[str, int] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict:
        """JSON-ready description of the zoo entry."""
        return {
            "name": self.name,
            "description": self.description,
            "family": self.family,
            "source": self.source,
            "parameters": self.parameters,
            "default_dims": dict(self.default_dims),
        }


@dataclass(frozen=True)
class _Recipe:
    entry: ZooEntry
    build: Callable[[], tuple[onnx.ModelProto, str]]  # -> (model, note for the doc string)
    metadata: dict[str, str] = field(default_factory=dict, hash=False)


_IMAGENET = (
    "Input: NCHW float32 images [batch, 3, 224, 224] normalised with the ImageNet mean and std; "
    "output: 1000 ImageNet class scores."
)
_LIGHT_SOURCE = "onnx package test data backend/test/data/light/light_{light}.onnx (ONNX Model Zoo architecture)"

# name, light file stem, what it is, exact parameter count (checked by the tests against the built model)
_CNNS = [
    ("alexnet", "bvlc_alexnet", "AlexNet (BVLC Caffe)", 60_965_224),
    ("densenet121", "densenet121", "DenseNet-121", 8_146_152),
    ("inception_v1", "inception_v1", "Inception v1 (GoogLeNet)", 6_998_552),
    ("inception_v2", "inception_v2", "Inception v2 (BN-Inception)", 11_234_792),
    ("resnet50", "resnet50", "ResNet-50 v1", 25_610_152),
    ("shufflenet", "shufflenet", "ShuffleNet v1", 1_420_152),
    ("squeezenet", "squeezenet", "SqueezeNet 1.0", 1_235_496),
    ("vgg19", "vgg19", "VGG-19", 143_667_240),
    ("zfnet512", "zfnet512", "ZFNet-512", 87_250_536),
]

_BERTS = [
    ("bert-base", BERT_BASE, "BERT-base encoder (12 layers, hidden 768, 12 heads)"),
    ("bert-tiny", BERT_TINY, "BERT-tiny encoder (2 layers, hidden 128, 2 heads), for fast tests"),
]
_BERT_SOURCE = (
    "built by onnxaccel in the layout PyTorch exports Hugging Face transformers.BertModel "
    "(opset 17), so ONNX Runtime's transformer optimizer fuses it"
)
_BERT_IO = (
    "Inputs: input_ids, attention_mask, token_type_ids (int64 [batch, sequence]); outputs: "
    "last_hidden_state [batch, sequence, hidden], pooler_output [batch, hidden]."
)


def _cnn_recipe(name: str, light: str, what: str, parameters: int) -> _Recipe:
    def build() -> tuple[onnx.ModelProto, str]:
        result = build_light_cnn(name, light)
        note = ""
        if result.upgrade_error:
            note = (
                f" Kept at opset {result.opset}: onnx.version_converter could not upgrade it ({result.upgrade_error})."
            )
        return result.model, note

    entry = ZooEntry(
        name=name,
        description=f"{what} image classifier with seeded random weights, batch dimension dynamic.",
        family="cnn",
        source=_LIGHT_SOURCE.format(light=light),
        parameters=parameters,
        default_dims={},
    )
    return _Recipe(entry, build, {META_PREPROCESS: "imagenet"})


def _bert_recipe(name: str, config: BertConfig, what: str) -> _Recipe:
    def build() -> tuple[onnx.ModelProto, str]:
        return build_bert(config, seed_for(name)), ""

    entry = ZooEntry(
        name=name,
        description=f"{what} with seeded random weights (N(0, 0.02)).",
        family="transformer",
        source=_BERT_SOURCE,
        parameters=config.parameter_count(),
        default_dims={"sequence": 128},
    )
    return _Recipe(entry, build)


_RECIPES: dict[str, _Recipe] = {
    recipe.entry.name: recipe
    for recipe in [_cnn_recipe(*row) for row in _CNNS] + [_bert_recipe(*row) for row in _BERTS]
}


def entries() -> list[ZooEntry]:
    """Every zoo entry, sorted by name."""
    return [_RECIPES[name].entry for name in sorted(_RECIPES)]


def find_recipe(name: str) -> _Recipe:
    """The recipe for ``name`` (case-insensitive, an optional ``zoo:`` prefix allowed)."""
    key = name.strip().lower()
    if key.startswith(ZOO_PREFIX):
        key = key[len(ZOO_PREFIX) :]
    if key in _RECIPES:
        return _RECIPES[key]
    names = sorted(_RECIPES)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
    hint = f"Did you mean '{close[0]}'? " if close else ""
    raise ModelNotFoundError(
        f"There is no model '{name}' in the onnxaccel zoo.",
        f"{hint}The zoo has: {', '.join(names)}.",
    )


def build_model_bytes(name: str) -> bytes:
    """Build zoo model ``name``, stamp its metadata and doc string, check it, and serialize it once."""
    recipe = find_recipe(name)
    entry = recipe.entry
    model, note = recipe.build()
    io = _IMAGENET if entry.family == "cnn" else _BERT_IO
    stamp(
        model,
        name=entry.name,
        doc=f"onnxaccel zoo model '{entry.name}': {entry.description} {io} Source: {entry.source}.{note}",
        dim_defaults=entry.default_dims,
        extra=recipe.metadata,
    )
    serialized = model.SerializeToString()  # one copy of a model that may be half a GB, shared by check and save
    validate(model, entry.name, serialized=serialized)
    return serialized
