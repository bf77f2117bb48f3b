"""`batch` over images chooses its preprocessing as `run` does and says which ran (issue 20): the YOLOv8 detector
(Ultralytics metadata) gets the yolo letterbox, not the ImageNet crop and mean/std it silently got before; a model
whose metadata names no preset is fed raw pixels with a note; `--preprocess` wins."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnxruntime as ort

from onnxaccel.inputs_files import ImagePreprocess, read_image
from onnxaccel.model import load_model
from onnxaccel.scale import load_results


def test_yolo_images_get_the_letterbox_from_its_metadata(cli, tmp_path, yolo_model, photo):
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("astronaut.png", "coffee.png"):
        shutil.copy(photo(name), folder / name)
    out = tmp_path / "out"
    result = cli(str(yolo_model), "--input", str(folder), "--output", str(out), "--target", "cpu", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["preprocess"]["preset"] == "yolo" and "task=detect" in report["preprocess"]["origin"]
    model = load_model(yolo_model)
    pre = ImagePreprocess(preset="yolo", scale=1 / 255.0, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    session = ort.InferenceSession(str(yolo_model), providers=["CPUExecutionProvider"])
    got = load_results(out)
    for index, name in enumerate(("astronaut.png", "coffee.png")):
        image = read_image(folder / name, model.inputs[0], (1, 3, 640, 640), pre)[0]
        want = session.run(None, {"images": image})[0][0]
        row = [i for i, rid in enumerate(got.row_ids) if rid.endswith(name)]
        assert row, got.row_ids
        np.testing.assert_allclose(got.outputs["output0"][row[0]], want, rtol=1e-4, atol=1e-3)


def test_a_model_without_preset_metadata_is_fed_raw_pixels_and_says_so(cli, tmp_path, pretrained_cls, photo):
    folder = tmp_path / "photos"
    folder.mkdir()
    shutil.copy(photo("page.png"), folder / "page.png")
    shape = ("--shape", "x=1x3x48x192")
    result = cli(str(pretrained_cls), "--input", str(folder), "--output", str(tmp_path / "out"), "--target", "cpu",
                 *shape)
    assert result.exit_code == 0, result.output
    assert "images preprocessed on the host: none" in " ".join(result.output.split())
    forced = cli(str(pretrained_cls), "--input", str(folder), "--output", str(tmp_path / "out2"), "--target", "cpu",
                 "--preprocess", "scale01", "--json", *shape)
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.stdout)["preprocess"]["preset"] == "scale01"
