"""BucketedRunner on real ONNX Runtime CPU sessions: padded runs equal unpadded ones (BERT's attention mask pads
with 0), outputs cropped back, the smallest bucket that fits chosen, a clear error for feeds that fit none, INPUT:AXIS
dim names (PP-OCR's det names its dims p2o.DynamicDimension.N), and a compile-cache key per bucket."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from onnxaccel.engines import buckets as buckets_module
from onnxaccel.engines import compile_model
from onnxaccel.engines.buckets import BucketedRunner, ShapeBuckets, bucket_models, compiles_per_shape
from onnxaccel.errors import InputError, ShapeError
from onnxaccel.model import load_model
from onnxaccel.target import parse_target
from onnxaccel.transform.compile_cache import bucket_cache_keys

CPU = parse_target("cpu")


@pytest.fixture(scope="module")
def bert():
    return load_model("zoo:bert-tiny")


@pytest.fixture(scope="module")
def bert_runner(bert):
    with BucketedRunner(bert, CPU, ShapeBuckets.parse("sequence=16,32,64"), per_bucket=True) as runner:
        runner.warm_up()
        yield runner


def _tokens(length: int, batch: int = 2) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(length).integers(1, 1000, (batch, length)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def test_length_20_runs_in_bucket_32_and_equals_the_unpadded_run(bert, bert_runner):
    feeds = _tokens(20)
    out = bert_runner.run(feeds)
    with compile_model(bert.bind({"sequence": (20,)}, batch=2), CPU) as plain:
        ref = plain.run(feeds)
    assert out["last_hidden_state"].shape == (2, 20, 128)  # cropped back from 32
    np.testing.assert_allclose(out["last_hidden_state"], ref["last_hidden_state"], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(out["pooler_output"], ref["pooler_output"], atol=1e-4, rtol=1e-4)
    info = bert_runner.describe()["shape_buckets"]
    assert info["last"] == "sequence=32" and info["per_bucket_sessions"] is True
    assert [b["bucket"] for b in info["buckets"]] == ["sequence=16", "sequence=32", "sequence=64"]
    assert all(b["compile_seconds"] > 0 and b["warm_seconds"] > 0 for b in info["buckets"])


def test_each_bucket_has_a_session_bound_at_its_size(bert_runner):
    assert len(bert_runner.runners) == 3
    assert {b: r.model.input_shapes["input_ids"] for b, r in bert_runner.runners.items()} == {
        (16,): (1, 16), (32,): (1, 32), (64,): (1, 64)}


def test_bound_run_pads_and_crops(bert, bert_runner):
    feeds = _tokens(40, batch=1)
    bound = bert_runner.bind(feeds)
    bound.run()
    out = bound.outputs()
    assert out["last_hidden_state"].shape == (1, 40, 128)
    np.testing.assert_allclose(out["last_hidden_state"], bert_runner.run(feeds)["last_hidden_state"], atol=1e-5)
    assert bert_runner.describe()["shape_buckets"]["last"] == "sequence=64"


def test_a_feed_that_fits_no_bucket_names_the_buckets(bert_runner):
    with pytest.raises(InputError) as caught:
        bert_runner.run(_tokens(65, batch=1))
    assert "sequence=16,32,64" in caught.value.message and "sequence=64" in caught.value.hint


def test_a_rank_mismatch_is_reported_before_buckets(bert_runner):
    feeds = _tokens(20, batch=1)
    feeds["input_ids"] = feeds["input_ids"][None]
    with pytest.raises(InputError, match="rank|dimension"):
        bert_runner.run(feeds)


def test_the_migraphx_ep_recompiles_on_a_new_input_shape_upstream():
    """Why migraphx targets get a session per bucket: the EP's compute function recompiles whenever an input's
    lengths differ from its program's (the vendored upstream text; the citation sits on PER_SHAPE_DEVICES)."""
    snippet = (Path(__file__).parent / "migraphx" / "upstream" / "buckets_ep_recompile_ROCm_6ac4f76.txt").read_text()
    assert "if (mgx_lens != ort_lens) {" in snippet and "input_shape_match = false;" in snippet
    assert "Input shape mismatch detected. Recompiling" in snippet
    source = inspect.getsource(buckets_module)
    assert "buckets_ep_recompile_ROCm_6ac4f76.txt" in source and "Input shape mismatch detected. Recompiling" in source
    assert compiles_per_shape(parse_target("migraphx"))


def test_cpu_shares_one_session_and_gpu_compilers_get_one_per_bucket(bert):
    assert not compiles_per_shape(CPU)
    assert all(compiles_per_shape(parse_target(t)) for t in ("cuda", "tensorrt", "migraphx", "migraphx@migraphx"))
    with BucketedRunner(bert, CPU, ShapeBuckets.parse("sequence=16,32")) as runner:
        assert list(runner.runners) == [(32,)]
        assert runner.run(_tokens(10, batch=1))["last_hidden_state"].shape == (1, 10, 128)


def test_compile_cache_key_differs_per_bucket(bert):
    buckets = ShapeBuckets.parse("sequence=32,64")
    for target in ("cpu", "migraphx", "tensorrt"):
        keys = bucket_cache_keys(bert, parse_target(target), buckets, runtime={"onnxruntime": "x"}, host="h")
        assert set(keys) == {"sequence=32", "sequence=64"}
        assert keys["sequence=32"].digest != keys["sequence=64"].digest
        assert keys["sequence=64"].shapes["input_ids"] == [1, 64]


# -- images: PP-OCR det, dims named by INPUT:AXIS --------------------------------------------------------------

@pytest.fixture(scope="module")
def det(pretrained_det):
    return load_model(pretrained_det)


@pytest.fixture(scope="module")
def page(photo) -> np.ndarray:
    """A 96x160 crop of scikit-image's page.png (printed text), PP-OCR normalized: (x/255 - 0.5) / 0.5, NCHW."""
    pixels = np.asarray(Image.open(photo("page.png")).convert("RGB"), np.float32)[:96, :160] / 255.0
    return ((pixels - 0.5) / 0.5).transpose(2, 0, 1)[None].copy()


def test_input_axis_names_bind_the_dims_an_exporter_named(det):
    buckets = ShapeBuckets.parse("x:2,x:3=128x192,256x256")
    buckets.validate(det)
    assert buckets.bindings_for(det, (128, 192)) == {"p2o.DynamicDimension.1": (128,),
                                                      "p2o.DynamicDimension.2": (192,)}
    models = bucket_models(det, buckets)
    assert models[(256, 256)].input_shapes["x"] == (1, 3, 256, 256)
    with pytest.raises(ShapeError) as caught:
        ShapeBuckets.parse("x:9=64").validate(det)
    assert "x:2" in caught.value.hint and "x:3" in caught.value.hint


def test_ocr_det_map_is_cropped_to_the_input_size(det, page):
    with BucketedRunner(det, CPU, ShapeBuckets.parse("x:2,x:3=128x192,256x256"), per_bucket=True) as runner:
        out = next(iter(runner.run({"x": page}).values()))
        assert runner.describe()["shape_buckets"]["last"] == "x:2=128,x:3=192"
        exact = next(iter(runner.run({"x": np.pad(page, ((0, 0), (0, 0), (0, 32), (0, 32)))}).values()))
    with compile_model(det.bind({"x": page.shape}), CPU) as plain:
        ref = next(iter(plain.run({"x": page}).values()))
        ref_exact = next(iter(plain.run({"x": np.pad(page, ((0, 0), (0, 0), (0, 32), (0, 32)))}).values()))
    assert out.shape == ref.shape == (1, 1, 96, 160)
    # A feed at the bucket's own size is not padded: the same map as an unbucketed session.
    np.testing.assert_allclose(exact, ref_exact, atol=1e-5)
    # Padding a convolutional detector moves its border values (DB's context reaches the padding), so the text
    # mask (DB's 0.3 threshold, rapidocr) agrees on most pixels, not all.
    assert ((out > 0.3) == (ref > 0.3)).mean() > 0.85 and (ref > 0.3).any()


def test_padding_images_is_said_padding_sequences_is_not(det, bert_runner):
    """Bucketed image dims change a convolutional model's border outputs (the test above): the runner says so in
    its warnings; a masked sequence axis gives the unpadded result and gets no such note."""
    with BucketedRunner(det, CPU, ShapeBuckets.parse("x:2,x:3=128x192,256x256")) as runner:
        assert any("pad image input(s) x" in w for w in runner.warnings), runner.warnings
    assert not any("pad image" in w for w in bert_runner.warnings)
