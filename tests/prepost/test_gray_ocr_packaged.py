"""A 1-channel text recognizer as its PyPI wheel ships it (issue 38: a test per item on a real model of its kind).

ddddocr 1.0.6's common.onnx takes input1[1, 1, 64, image_wdith]: one gray channel, 64 rows, a free width. An
image given to `run` becomes one channel (Pillow 'L', from a colour file too), 64 rows high; with ddddocr's own
normalization (/255, then (x - 0.5) / 0.5: --preprocess scale01 --mean 0.5 --std 0.5) the model reads what
ddddocr itself reads. tests/prepost/test_image_inputs_by_model.py covers the same on a PP-OCR recognizer adapted
to one channel in the test.
"""

from __future__ import annotations

import ast
import json

import numpy as np
import onnxruntime as ort
from PIL import Image, ImageDraw, ImageFont
from typer.testing import CliRunner

from onnxaccel.cli.main import app

DDDDOCR_ARGS = ["--preprocess", "scale01", "--mean", "0.5", "--std", "0.5"]


def _run(*args) -> dict:
    result = CliRunner().invoke(app, ["run", *map(str, args), "-t", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _charset(model) -> list[str]:
    """ddddocr's class names: the one long list literal in its __init__.py (read, not imported)."""
    tree = ast.parse((model.parent / "__init__.py").read_text(encoding="utf-8"))
    return next(ast.literal_eval(node.value) for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and len(node.value.elts) > 1000)


def _decode(indices: np.ndarray, charset: list[str]) -> str:
    """ddddocr's CTC collapse: repeats merged, blanks (0) dropped."""
    text, last = [], 0
    for index in indices.reshape(-1).tolist():
        if index != last and index != 0:
            text.append(charset[index])
        last = index
    return "".join(text)


def test_gray_photo_with_a_bound_width_is_fed_as_one_channel(ddddocr_model, photo, tmp_path):
    gray = tmp_path / "astronaut_gray.png"
    Image.open(photo("astronaut.png")).convert("L").save(gray)
    data = _run(ddddocr_model, "--input", f"input1={gray}", "--shape", "image_wdith=256")
    fed = data["inputs"][0]
    assert fed["source"] == "image" and fed["shape"] == [1, 1, 64, 256] and fed["type"] == "float32"
    assert fed["preprocess"]["channels"] == 1 and fed["preprocess"]["color"] == "grayscale"
    assert fed["preprocess"]["fed_size"] == [256, 64] and "grayscale NCHW" in fed["detail"]
    assert data["input_shapes"] == {"input1": [1, 1, 64, 256]}
    output = data["outputs"][0]
    assert output["name"] == "output" and output["dtype"] == "int64" and output["shape"][0] == 1


def test_colour_photo_becomes_one_channel_and_the_width_follows_it(ddddocr_model, photo):
    """A colour photo (coffee.png, 600x400 RGB) is converted to one channel; the free width binds by the
    image (docs/PREPROCESSING.md: `none` keeps the image's own size), and a stretched aspect ratio is warned."""
    data = _run(ddddocr_model, "--input", f"input1={photo('coffee.png')}")
    fed = data["inputs"][0]
    assert fed["preprocess"]["channels"] == 1 and fed["preprocess"]["color"] == "grayscale"
    assert fed["shape"][:3] == [1, 1, 64] and fed["preprocess"]["original_size"] == [600, 400]
    width = fed["shape"][3]
    if width != 96:  # 600 * 64 / 400: the aspect ratio kept
        assert any("aspect ratio" in w for w in data["warnings"]), data["warnings"]


def test_rendered_colour_captcha_reads_as_ddddocr_reads_it(ddddocr_model, tmp_path):
    """A colour image of the text '3a7k', 160x64: `run` with ddddocr's normalization gives exactly the classes
    ONNX Runtime gives on ddddocr's own tensor (Pillow 'L', /255, (x - 0.5) / 0.5), and they spell '3a7k'."""
    image = Image.new("RGB", (160, 64), (240, 225, 190))
    ImageDraw.Draw(image).text((10, 6), "3a7k", fill=(30, 20, 110), font=ImageFont.load_default(size=44))
    path = tmp_path / "captcha.png"
    image.save(path)
    saved = tmp_path / "out.npz"
    data = _run(ddddocr_model, "--input", f"input1={path}", *DDDDOCR_ARGS, "--save", saved)
    fed = data["inputs"][0]
    assert fed["shape"] == [1, 1, 64, 160] and fed["preprocess"]["resized"] is False
    assert fed["preprocess"]["color"] == "grayscale" and fed["preprocess"]["mean"] == [0.5]
    with np.load(saved) as outputs:
        got = outputs["output"]
    tensor = (np.asarray(image.convert("L"), np.float32) / 255.0 - 0.5) / 0.5
    session = ort.InferenceSession(str(ddddocr_model), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input1": tensor[None, None]})[0]
    np.testing.assert_array_equal(got, expected)
    assert _decode(got, _charset(ddddocr_model)) == "3a7k"
