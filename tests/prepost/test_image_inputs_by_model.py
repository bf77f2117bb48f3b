"""Images follow the model's image input: its channel count (grayscale, RGB, RGBA), its layout and dtype (uint8
NHWC pixels for a model with its preprocessing embedded), and its fixed size (an image already at that size is
not resized or cropped); every output says what preprocessing did, with a warning when it crops or stretches."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from PIL import Image
from typer.testing import CliRunner

from onnxaccel.cli.main import app


def _run(*args) -> dict:
    result = CliRunner().invoke(app, ["run", *map(str, args), "-t", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _saved(path) -> np.ndarray:
    with np.load(path) as data:
        return data[data.files[0]]


def _session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def gray_rec(pretrained_rec, tmp_path_factory):
    """PP-OCRv4's pretrained recognizer adapted to one input channel: its first convolution's weights summed over
    the three colour channels (so a gray image x gives what the RGB model gives for [x, x, x]), the input declared
    [?, 1, ?, W]. No 1-channel image model ships in the installed test packages; this one keeps real weights."""
    model = onnx.load(str(pretrained_rec))
    first = next(n for n in model.graph.node if "x" in n.input)
    weight = first.input[1]
    for node in model.graph.node:
        if weight in node.output:
            value = numpy_helper.to_array(node.attribute[0].t)
            node.attribute[0].t.CopyFrom(numpy_helper.from_array(value.sum(axis=1, keepdims=True)))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 1
    path = tmp_path_factory.mktemp("gray") / "rec_gray.onnx"
    onnx.save(model, str(path))
    return path


def test_a_grayscale_png_feeds_a_one_channel_ocr_model(gray_rec, photo, tmp_path):
    page = photo("text.png")  # a grayscale photograph of printed text
    out = tmp_path / "out.npz"
    report = _run(gray_rec, "--input", f"x={page}", "--shape", "x=1x1x48x320", "--save", out)
    pre = report["preprocess"]["x"]
    assert pre["channels"] == 1 and pre["color"] == "grayscale"
    gray = np.asarray(Image.open(page).convert("L").resize((320, 48), Image.BILINEAR), np.float32)
    expected = _session(gray_rec).run(None, {"x": gray[None, None]})[0]
    np.testing.assert_allclose(_saved(out), expected, atol=1e-5)
    assert any("changed the aspect ratio" in w for w in report["warnings"])


def test_an_image_feeds_a_uint8_nhwc_model_with_embedded_preprocessing(photo, tmp_path):
    from onnxaccel.model import load_model
    from onnxaccel.transform.embed_preprocess import embedded_copy

    embedded = embedded_copy(load_model("zoo:squeezenet"), "imagenet")  # data_0[batch, 224, 224, 3] uint8
    cat = photo("chelsea.png")
    report = _run(embedded, "--input", cat, "--save", tmp_path / "e.npz")
    pre = report["preprocess"]["data_0"]
    assert pre["layout"] == "nhwc" and pre["pixels_uint8"] and pre["mean"] is None
    assert report["inputs"][0]["shape"] == [1, 224, 224, 3] and report["inputs"][0]["type"] == "uint8"
    plain = _run("zoo:squeezenet", "--input", cat, "--preprocess", "imagenet", "--save", tmp_path / "p.npz")
    assert plain["preprocess"]["data_0"]["crop"] == pre["crop"]
    np.testing.assert_allclose(_saved(tmp_path / "e.npz"), _saved(tmp_path / "p.npz"), atol=1e-5)


def test_imagenet_feeds_an_image_already_at_the_model_size_as_it_is(pretrained_det, photo, tmp_path):
    image = tmp_path / "page.png"
    Image.open(photo("astronaut.png")).convert("RGB").resize((800, 608)).save(image)
    out = tmp_path / "out.npz"
    report = _run(pretrained_det, "--input", f"x={image}", "--shape", "x=1x3x608x800", "--preprocess", "imagenet",
                  "--save", out)
    pre = report["preprocess"]["x"]
    assert pre["original_size"] == pre["fed_size"] == [800, 608]
    assert pre["crop"] is None and pre["resized"] is False and pre["warning"] is None
    assert "not resized" in report["inputs"][0]["detail"]
    pixels = np.asarray(Image.open(image), np.float32) / 255
    x = ((pixels - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]).astype(np.float32).transpose(2, 0, 1)[None]
    np.testing.assert_allclose(_saved(out), _session(pretrained_det).run(None, {"x": x})[0], atol=1e-4)


def test_a_crop_is_reported_as_a_warning(photo):
    report = _run("zoo:squeezenet", "--input", photo("chelsea.png"), "--preprocess", "imagenet")
    warning = report["preprocess"]["data_0"]["warning"]
    assert "cropped the image" in warning and "451x300" in warning and warning in " ".join(report["warnings"])


def test_bgr_flips_the_channels_fed(pretrained_cls, photo, tmp_path):
    rgb, bgr = tmp_path / "rgb.npz", tmp_path / "bgr.npz"
    args = (pretrained_cls, "--input", photo("astronaut.png"), "--shape", "x=1x3x48x192", "--preprocess", "scale01")
    first, second = _run(*args, "--save", rgb), _run(*args, "--bgr", "--save", bgr)
    assert first["preprocess"]["x"]["color"] == "RGB" and second["preprocess"]["x"]["color"] == "BGR"
    assert not np.allclose(_saved(rgb), _saved(bgr))


def test_batch_takes_the_image_options_of_run(squeezenet_images, tmp_path):
    result = CliRunner().invoke(app, ["batch", "zoo:squeezenet", "-i", str(squeezenet_images), "-o",
                                      str(tmp_path / "o"), "-t", "cpu", "--preprocess", "imagenet", "--bgr",
                                      "--mean", "0.5,0.5,0.5", "--std", "0.25,0.25,0.25", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["preprocess"]["channel_order"] == "bgr" and report["preprocess"]["mean"] == [0.5, 0.5, 0.5]
    assert any("center-crops" in w for w in report["warnings"])


@pytest.fixture
def squeezenet_images(photo, tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("chelsea.png", "coffee.png"):
        Image.open(photo(name)).convert("RGB").save(folder / name)
    return folder
