"""The pipeline's lazy steps: load, bind, convert and compile run when needed, each model step once, and the
target (precision included) stays the caller's value from the command to the runner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from model_builders import make_string_input_model

from onnxaccel import pipeline
from onnxaccel.errors import InputError, ModelError
from onnxaccel.pipeline import (
    BoundModel,
    ConvertedModel,
    FeedsForModel,
    ModelFromSource,
    RunnerFromVariant,
    compile_only,
    prepare,
)
from onnxaccel.target import parse_target


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch) -> Path:
    """An empty model cache: converted variants are written now, not found from an earlier run."""
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture()
def string_input_path(tmp_path) -> Path:
    """y = x * 2 (float, converts to FP16) beside s_out = Identity(s) (a string input nothing can synthesize)."""
    return make_string_input_model(tmp_path / "strings.onnx")


def _count_convert(monkeypatch) -> list:
    calls = []
    real = pipeline.convert_for_target

    def counting(model, target):
        calls.append(str(target))
        return real(model, target)

    monkeypatch.setattr(pipeline, "convert_for_target", counting)
    return calls


def test_steps_do_nothing_until_called_and_the_model_steps_work_once(mlp_path, monkeypatch):
    missing = ModelFromSource(str(mlp_path.parent / "absent.onnx"))  # built: nothing read yet
    with pytest.raises(ModelError):
        missing()
    model = ModelFromSource(str(mlp_path))
    assert model() is model()  # read once
    calls = _count_convert(monkeypatch)
    variant = ConvertedModel(BoundModel(model, batch=2), parse_target("cpu/fp16"))
    compile_runner = RunnerFromVariant(variant)
    assert calls == []  # nothing converted before a runner is asked for
    first, second = compile_runner(), compile_runner()
    try:
        assert first is not second and first.session is not second.session  # a runner per call
        assert calls == ["cpu/fp16"]  # converted once for both
    finally:
        first.close()
        second.close()


def test_the_converted_variant_carries_the_precision_to_the_runner(mlp_path):
    fp16 = parse_target("cpu/fp16")
    variant = ConvertedModel(BoundModel(ModelFromSource(str(mlp_path)), batch=2), fp16)()
    assert variant.converted and variant.target is fp16 and variant.precision == "fp16"
    assert variant.engine_target.precision == "fp32"  # the engine runs the FP16 graph as it is
    prepared = prepare(str(mlp_path), fp16, batch=2)
    try:
        assert prepared.target is fp16 and prepared.runner.target is fp16
    finally:
        prepared.close()
    native = ConvertedModel(ModelFromSource(str(mlp_path)), parse_target("cpu"))()
    assert not native.converted and native.engine_target is native.target


def test_a_further_runner_and_a_reference_reuse_the_bound_model_and_feeds(mlp_path, monkeypatch):
    calls = _count_convert(monkeypatch)
    drawn = []
    real_feeds = pipeline.prepare_feeds
    monkeypatch.setattr(pipeline, "prepare_feeds", lambda *a, **k: drawn.append(1) or real_feeds(*a, **k))
    prepared = prepare(str(mlp_path), parse_target("cpu/fp16"), batch=3)
    other = prepared.new_runner()
    reference = prepared.for_target(parse_target("cpu"))
    try:
        assert calls == ["cpu/fp16", "cpu"] and len(drawn) == 1  # nothing converted or drawn twice
        assert reference.feeds is prepared.feeds and reference.model is prepared.model
        assert str(reference.runner.target) == "cpu" and str(other.target) == "cpu/fp16"
        np.testing.assert_array_equal(other.run(prepared.feeds)["probs"], prepared.run()["probs"])
        np.testing.assert_allclose(reference.run()["probs"], prepared.run()["probs"], atol=1e-2)
    finally:
        for closing in (other, reference, prepared):
            closing.close()


def test_compile_only_needs_no_feeds_where_prepare_cannot_draw_them(string_input_path):
    fp16 = parse_target("cpu/fp16")
    with pytest.raises(InputError, match="Cannot synthesize input 's'"):
        prepare(str(string_input_path), fp16)
    compiled = compile_only(str(string_input_path), fp16, batch=1)
    try:
        assert compiled.model.input_shapes == {"x": (1, 4), "s": (1,)} and compiled.runner.target is fp16
        out = compiled.runner.run({"x": np.ones((1, 4), np.float32), "s": np.array(["a"], dtype=object)})
        assert out["y"].tolist() == [[2.0] * 4] and out["s_out"].tolist() == ["a"]
        assert any("converted to FP16" in w for w in compiled.warnings)
    finally:
        compiled.close()


def test_a_conversion_reads_the_source_once_and_never_reads_back_what_it_wrote(mlp_path, fresh_cache, monkeypatch):
    loads: list[str] = []
    real_load = onnx.load

    def counting_load(f, *args, **kwargs):
        loads.append(Path(str(f)).name)
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(onnx, "load", counting_load)
    feeds = FeedsForModel(ModelFromSource(str(mlp_path)), batch=2)
    runner = RunnerFromVariant(ConvertedModel(feeds.bound_model, parse_target("cpu/fp16")))()
    runner.close()
    written = sorted(p.name for p in (fresh_cache / "runtime-models").glob("*.onnx"))
    assert len(written) == 1 and "fp16" in written[0]
    assert loads.count(mlp_path.name) == 1  # load_model's parse; the weights were in memory already
    assert written[0] not in loads  # the variant just written is used from memory
    loads.clear()
    runner = prepare(str(mlp_path), parse_target("cpu/fp16"), batch=2).runner  # now a cache hit
    runner.close()
    assert loads.count(mlp_path.name) == 1 and loads.count(written[0]) == 1
