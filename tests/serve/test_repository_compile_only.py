"""A server compiles its models without feeds of its own (pipeline.compile_only): a model whose inputs no feed
can be drawn for (strings) loads at a precision onnxaccel converts, where a feed-building prepare refused it."""

from __future__ import annotations

from model_builders import make_string_input_model

from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.repository import load_instance


def test_a_string_input_model_is_served_in_fp16_without_drawing_feeds(tmp_path):
    path = make_string_input_model(tmp_path / "strings.onnx")
    instance = load_instance(ModelConfig(name="strings", source=str(path), target="cpu", precision="fp16", max_batch=1))
    try:
        assert any("converted to FP16" in w for w in instance.warnings)
    finally:
        instance.close()
