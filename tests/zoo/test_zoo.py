"""The built-in zoo: real builds, real ONNX Runtime sessions, no mocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from onnxaccel.errors import ModelNotFoundError  # noqa: E402
from onnxaccel.zoo import ZooEntry, export_model, get_entry, get_model_path, list_models, zoo_cache_dir  # noqa: E402

CNNS = [
    "alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
]
FAST_CNNS = ["resnet50", "squeezenet"]
SLOW_CNNS = [name for name in CNNS if name not in FAST_CNNS]
ALL_NAMES = sorted([*CNNS, "bert-base", "bert-tiny"])
FP16_LIMIT = 6e4  # largest float16 is 65504


def _cnn_params(names: list[str], slow: list[str]):
    return [pytest.param(name, marks=pytest.mark.slow) if name in slow else name for name in names]


def _session(model: onnx.ModelProto | Path, *, optimize: bool = True) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _images(count: int, seed: int = 0) -> np.ndarray:
    """Random ImageNet-normalised images (about zero mean, unit variance per channel)."""
    return np.random.default_rng(seed).standard_normal((count, 3, 224, 224), dtype=np.float32)


def _bert_feeds(batch: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, vocab, (batch, seq), dtype=np.int64),
        "attention_mask": np.ones((batch, seq), dtype=np.int64),
        "token_type_ids": np.zeros((batch, seq), dtype=np.int64),
    }


def _float_parameter_count(model: onnx.ModelProto) -> int:
    return sum(int(np.prod(init.dims)) for init in model.graph.initializer if init.data_type == onnx.TensorProto.FLOAT)


def _with_every_intermediate_as_output(model: onnx.ModelProto) -> onnx.ModelProto:
    inferred = onnx.shape_inference.infer_shapes(model)
    outputs = {out.name for out in inferred.graph.output}
    for info in inferred.graph.value_info:
        if info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT and info.name not in outputs:
            inferred.graph.output.append(info)
    return inferred


# ---------------------------------------------------------------------------------------------------
# Catalogue and names


def test_list_models_names_every_zoo_model_sorted_with_exact_metadata():
    entries = list_models()
    assert [entry.name for entry in entries] == ALL_NAMES
    assert all(isinstance(entry, ZooEntry) for entry in entries)
    by_name = {entry.name: entry for entry in entries}
    for name in CNNS:
        assert by_name[name].family == "cnn"
        assert by_name[name].default_dims == {}
        assert "light_" in by_name[name].source
    assert by_name["bert-base"].family == by_name["bert-tiny"].family == "transformer"
    assert by_name["bert-base"].default_dims == {"sequence": 128}
    # transformers.BertModel(BertConfig()).num_parameters() for bert-base-uncased
    assert by_name["bert-base"].parameters == 109_482_240
    assert json.loads(json.dumps(by_name["resnet50"].to_dict())) == {
        "name": "resnet50",
        "description": by_name["resnet50"].description,
        "family": "cnn",
        "source": by_name["resnet50"].source,
        "parameters": 25_610_152,
        "default_dims": {},
    }


def test_list_models_returns_copies_that_callers_cannot_use_to_edit_the_registry():
    list_models()[-1].default_dims["sequence"] = 1
    assert get_entry("bert-tiny").default_dims == {"sequence": 128}


def test_unknown_name_raises_model_not_found_with_closest_match_and_zoo_list():
    with pytest.raises(ModelNotFoundError) as caught:
        get_model_path("resnet-50")
    error = caught.value
    assert "'resnet-50'" in error.message
    assert "Did you mean 'resnet50'?" in error.hint
    for name in ALL_NAMES:
        assert name in error.hint


def test_unknown_name_with_no_close_match_still_lists_the_zoo():
    with pytest.raises(ModelNotFoundError) as caught:
        get_entry("gpt2-xl")
    assert "Did you mean" not in caught.value.hint
    assert "squeezenet" in caught.value.hint


def test_names_are_case_insensitive_and_accept_the_zoo_prefix():
    assert get_entry("SqueezeNet").name == "squeezenet"
    assert get_entry(" zoo:BERT-Tiny ").name == "bert-tiny"


# ---------------------------------------------------------------------------------------------------
# Cache


def test_zoo_cache_dir_follows_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(tmp_path))
    assert zoo_cache_dir() == tmp_path / "zoo"


def test_zoo_cache_dir_defaults_to_the_user_cache_dir(monkeypatch):
    import platformdirs

    monkeypatch.delenv("ONNXACCEL_CACHE_DIR", raising=False)
    assert zoo_cache_dir() == Path(platformdirs.user_cache_dir("onnxaccel")) / "zoo"


def test_second_call_reuses_the_cached_file_without_rebuilding(monkeypatch, tmp_path):
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(tmp_path))
    first = get_model_path("squeezenet")
    stamp = first.stat().st_mtime_ns
    os.utime(first, ns=(stamp - 10**9, stamp - 10**9))  # make any rewrite visible in the mtime
    second = get_model_path("squeezenet")
    assert second == first
    assert second.stat().st_mtime_ns == stamp - 10**9
    assert get_model_path("squeezenet", rebuild=True).stat().st_mtime_ns != stamp - 10**9


def test_build_leaves_only_the_finished_file_in_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(tmp_path))
    path = get_model_path("bert-tiny")
    assert path.parent == tmp_path / "zoo"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    assert path.name.startswith("bert-tiny-") and path.suffix == ".onnx"


@pytest.mark.parametrize("name", ["squeezenet", "bert-tiny"])
def test_builds_in_two_caches_are_byte_identical(monkeypatch, tmp_path, name):
    paths = []
    for folder in ("a", "b"):
        monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(tmp_path / folder))
        paths.append(get_model_path(name))
    assert paths[0] != paths[1]
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_processes_racing_to_build_one_model_all_get_a_complete_file(tmp_path):
    script = "from onnxaccel.zoo import get_model_path; print(get_model_path('squeezenet'))"
    env = {**os.environ, "ONNXACCEL_CACHE_DIR": str(tmp_path)}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    racers = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True) for _ in range(3)
    ]
    paths = {racer.communicate(timeout=300)[0].strip() for racer in racers}
    assert all(racer.returncode == 0 for racer in racers)
    (path,) = paths
    onnx.checker.check_model(path)
    assert sorted(p.name for p in Path(path).parent.iterdir()) == [Path(path).name]


def test_export_model_writes_a_loadable_file_and_creates_parent_folders(tmp_path):
    dest = export_model("squeezenet", tmp_path / "nested" / "dir" / "squeeze.onnx")
    assert dest == tmp_path / "nested" / "dir" / "squeeze.onnx"
    onnx.checker.check_model(str(dest))
    session = _session(dest)
    (probs,) = session.run(None, {session.get_inputs()[0].name: _images(1)})
    assert probs.shape == (1, 1000, 1, 1)


def test_export_model_into_an_existing_directory_names_the_file_after_the_model(tmp_path):
    dest = export_model("bert-tiny", tmp_path)
    assert dest == tmp_path / "bert-tiny.onnx"
    assert onnx.load(str(dest)).metadata_props[0].key.startswith("onnxaccel.")


# ---------------------------------------------------------------------------------------------------
# Format: IR, opset, metadata, parameters


@pytest.mark.parametrize(
    "name", [*_cnn_params(CNNS, SLOW_CNNS), "bert-tiny", pytest.param("bert-base", marks=pytest.mark.slow)]
)
def test_model_is_opset_17_ir_8_with_zoo_metadata_and_exact_parameter_count(name):
    model = onnx.load(str(get_model_path(name)))
    entry = get_entry(name)
    assert model.ir_version == 8
    assert [(op.domain, op.version) for op in model.opset_import] == [("", 17)]
    meta = {prop.key: prop.value for prop in model.metadata_props}
    assert meta["onnxaccel.zoo"] == name
    assert json.loads(meta["onnxaccel.dim_defaults"]) == entry.default_dims
    assert meta.get("onnxaccel.preprocess") == ("imagenet" if entry.family == "cnn" else None)
    assert name in model.doc_string
    assert _float_parameter_count(model) == entry.parameters
    onnx.checker.check_model(model)
    initializer_names = {init.name for init in model.graph.initializer}
    assert not initializer_names & {inp.name for inp in model.graph.input}
    assert not any(node.op_type == "ConstantOfShape" for node in model.graph.node)
    assert len(model.graph.value_info) == 0


@pytest.mark.parametrize("name", _cnn_params(CNNS, SLOW_CNNS))
def test_cnn_has_symbolic_batch_on_its_input_and_output(name):
    model = onnx.load(str(get_model_path(name)), load_external_data=False)
    (image,) = model.graph.input
    dims = image.type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["batch", 3, 224, 224]
    for output in model.graph.output:
        assert output.type.tensor_type.shape.dim[0].dim_param == "batch"


# ---------------------------------------------------------------------------------------------------
# CNN behaviour


@pytest.mark.parametrize("name", _cnn_params(CNNS, SLOW_CNNS))
def test_cnn_batch_of_four_gives_each_sample_the_same_result_as_batch_of_one(name):
    session = _session(get_model_path(name))
    input_name = session.get_inputs()[0].name
    images = _images(4, seed=1)
    (batched,) = session.run(None, {input_name: images})
    assert batched.shape[0] == 4
    for i in range(4):
        (single,) = session.run(None, {input_name: images[i : i + 1]})
        np.testing.assert_allclose(batched[i : i + 1], single, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", _cnn_params(CNNS, SLOW_CNNS))
def test_cnn_activations_stay_within_float16_range_and_predictions_depend_on_the_input(name):
    model = _with_every_intermediate_as_output(onnx.load(str(get_model_path(name))))
    session = _session(model, optimize=False)  # keep every node, so every intermediate is a real one
    outputs = session.run(None, {session.get_inputs()[0].name: _images(4, seed=2)})
    assert len(outputs) > 20
    for value in outputs:
        assert np.isfinite(value).all()
        assert float(np.abs(value).max()) < FP16_LIMIT
    scores = outputs[0].reshape(4, -1)
    assert scores.std(axis=1).min() > 0, "every class got the same score"
    assert len(set(scores.argmax(axis=1).tolist())) > 1, "every input got the same top-1 class"


@pytest.mark.parametrize("name", _cnn_params(CNNS, SLOW_CNNS))
def test_cnn_converted_to_float16_runs_finite_and_close_to_float32(name):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(get_model_path(name)))
    half = convert_float_to_float16(model, keep_io_types=True)
    images = _images(2, seed=5)
    input_name = model.graph.input[0].name
    (want,) = _session(model).run(None, {input_name: images})
    (got,) = _session(half).run(None, {input_name: images})
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()


# ---------------------------------------------------------------------------------------------------
# BERT behaviour


@pytest.mark.parametrize("name", ["bert-tiny", pytest.param("bert-base", marks=pytest.mark.slow)])
def test_bert_runs_at_any_batch_and_sequence_with_declared_output_shapes(name):
    session = _session(get_model_path(name))
    hidden = 768 if name == "bert-base" else 128
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [i.shape for i in session.get_inputs()] == [["batch", "sequence"]] * 3
    for batch, seq in [(1, 7), (3, 128)]:
        last, pooled = session.run(None, _bert_feeds(batch, seq, vocab=30522))
        assert last.shape == (batch, seq, hidden)
        assert pooled.shape == (batch, hidden)
        assert np.isfinite(last).all() and np.isfinite(pooled).all()
        assert float(np.abs(pooled).max()) < 1.0  # tanh


@pytest.mark.parametrize("name", ["bert-tiny", pytest.param("bert-base", marks=pytest.mark.slow)])
def test_bert_padding_masked_out_leaves_unpadded_tokens_unchanged(name):
    session = _session(get_model_path(name))
    feeds = _bert_feeds(2, 24, vocab=30522, seed=3)
    feeds["attention_mask"][1, 15:] = 0  # sample 1: 15 real tokens, 9 padding
    last, _ = session.run(None, feeds)
    alone = {key: value[1:, :15] for key, value in feeds.items()}
    last_alone, _ = session.run(None, alone)
    np.testing.assert_allclose(last[1, :15], last_alone[0], rtol=0, atol=1e-4)
    # and the mask matters: attending to the padding changes the result
    feeds["attention_mask"][1, 15:] = 1
    unmasked, _ = session.run(None, feeds)
    assert np.abs(unmasked[1, :15] - last_alone[0]).max() > 1e-3


@pytest.mark.parametrize(
    ("name", "heads", "hidden", "layers"),
    [("bert-tiny", 2, 128, 2), pytest.param("bert-base", 12, 768, 12, marks=pytest.mark.slow)],
)
def test_onnxruntime_transformer_optimizer_fuses_attention_layernorm_and_gelu(tmp_path, name, heads, hidden, layers):
    from onnxruntime.transformers.optimizer import optimize_model

    source = get_model_path(name)
    # opt_level=0: Python fusions only. Any positive level first runs optimize_by_onnxruntime, which
    # imports torch in onnxruntime 1.32 (onnxruntime/transformers/optimizer.py).
    optimized = optimize_model(str(source), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0)
    stats = optimized.get_fused_operator_statistics()
    assert stats["Attention"] + stats["MultiHeadAttention"] == layers
    assert stats["SkipLayerNormalization"] == 2 * layers
    assert stats["Gelu"] + stats["BiasGelu"] + stats["FastGelu"] == layers
    assert stats["EmbedLayerNormalization"] == 1
    assert optimized.is_fully_optimized(stats)

    fused_path = tmp_path / "fused.onnx"
    optimized.save_model_to_file(str(fused_path))
    feeds = _bert_feeds(2, 16, vocab=30522, seed=4)
    feeds["attention_mask"][0, 11:] = 0
    expected = _session(source).run(None, feeds)
    actual = _session(fused_path).run(None, feeds)
    for want, got in zip(expected, actual, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
