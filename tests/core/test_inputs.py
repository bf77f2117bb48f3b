"""Feeds: synthesized, from .npy/.npz and images, and precise errors for wrong ones."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from onnxaccel import load_model
from onnxaccel.errors import InputError
from onnxaccel.inputs_files import IMAGENET_MEAN, IMAGENET_STD
from onnxaccel.inputs import (
    ImagePreprocess, PreprocessRequest, load_feeds, synthesize,
)


def test_synthesized_feeds_match_the_bound_signature_and_are_seeded(mlp_path):
    model = load_model(mlp_path).bind(batch=3)
    a, b = synthesize(model, seed=1), synthesize(model, seed=1)
    assert a["x"].shape == (3, 4) and a["x"].dtype == np.float32
    np.testing.assert_array_equal(a["x"], b["x"])
    assert not np.array_equal(a["x"], synthesize(model, seed=2)["x"])


def test_npy_input_binds_the_batch_from_the_data(tmp_path, mlp_path):
    np.save(tmp_path / "x.npy", np.ones((6, 4), np.float32))
    model, feeds = load_feeds(load_model(mlp_path), [f"x={tmp_path / 'x.npy'}"])
    assert model.input_shapes == {"x": (6, 4)} and feeds["x"].shape == (6, 4)


def test_npz_feeds_inputs_by_array_name(tmp_path, mlp_path):
    np.savez(tmp_path / "in.npz", x=np.zeros((2, 4), np.float32))
    _, feeds = load_feeds(load_model(mlp_path), [str(tmp_path / "in.npz")])
    assert feeds["x"].shape == (2, 4)


def test_npz_with_pickled_objects_is_refused(tmp_path, mlp_path):
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match="pickled"):
        load_feeds(load_model(mlp_path), [str(tmp_path / "obj.npz")])


def test_wrong_input_name_lists_the_real_ones(tmp_path, mlp_path):
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    with pytest.raises(InputError) as err:
        load_feeds(load_model(mlp_path), [f"input={tmp_path / 'x.npy'}"])
    assert "'input'" in err.value.message and "x" in err.value.hint


def test_wrong_shape_says_which_axis(tmp_path, mlp_path):
    np.save(tmp_path / "x.npy", np.ones((1, 5), np.float32))
    with pytest.raises(InputError) as err:
        load_feeds(load_model(mlp_path), [f"x={tmp_path / 'x.npy'}"])
    assert "Input 'x' axis 1 must be 4" in err.value.message and "[1, 5]" in err.value.message


def test_lossy_dtype_is_an_error_but_safe_casts_pass(tmp_path, mlp_path):
    np.save(tmp_path / "f64.npy", np.ones((1, 4), np.float64))
    with pytest.raises(InputError) as err:
        load_feeds(load_model(mlp_path), [f"x={tmp_path / 'f64.npy'}"])
    assert "expects float32" in err.value.message and "float64" in err.value.message
    np.save(tmp_path / "f16.npy", np.ones((1, 4), np.float16))
    _, feeds = load_feeds(load_model(mlp_path), [f"x={tmp_path / 'f16.npy'}"])
    assert feeds["x"].dtype == np.float32


def test_missing_file_and_unknown_suffix(tmp_path, mlp_path):
    with pytest.raises(InputError, match="not found"):
        load_feeds(load_model(mlp_path), ["x=/no/such.npy"])
    (tmp_path / "x.txt").write_text("1 2 3 4")
    with pytest.raises(InputError, match="unknown file type"):
        load_feeds(load_model(mlp_path), [f"x={tmp_path / 'x.txt'}"])


def test_image_becomes_a_normalized_contiguous_nchw_tensor(tmp_path, pretrained_cls):
    color = (200, 100, 50)
    Image.new("RGB", (300, 120), color).save(tmp_path / "solid.png")
    model = load_model(pretrained_cls)
    bound, feeds = load_feeds(model, [str(tmp_path / "solid.png")], shapes={"x": (1, 3, 48, 192)},
                              preprocess=PreprocessRequest("imagenet"))
    x = feeds["x"]
    assert x.shape == (1, 3, 48, 192) and x.flags["C_CONTIGUOUS"]
    expected = (np.array(color) / 255.0 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    np.testing.assert_allclose(x[0, :, 10, 10], expected, rtol=1e-5)


def test_image_preprocessing_is_overridable(tmp_path, pretrained_cls):
    Image.new("RGB", (64, 64), (255, 0, 0)).save(tmp_path / "red.png")
    pre = ImagePreprocess(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), channel_order="bgr")
    _, feeds = load_feeds(load_model(pretrained_cls), [str(tmp_path / "red.png")],
                          shapes={"x": (1, 3, 48, 192)}, preprocess=pre)
    np.testing.assert_allclose(feeds["x"][0, :, 5, 5], [-1.0, -1.0, 1.0], atol=1e-6)


def test_image_for_a_non_image_input_is_refused(tmp_path, mlp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    with pytest.raises(InputError, match="not a 4-D image tensor"):
        load_feeds(load_model(mlp_path), [str(tmp_path / "a.png")])
