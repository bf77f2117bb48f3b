"""Pre/post-processing pieces: letterbox arithmetic and its undo, NMS, the vendored ImageNet labels, Ultralytics
metadata, preset choice, and images binding symbolic H/W by their size after preprocessing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from onnxaccel import load_model
from onnxaccel.cli.main import app
from onnxaccel.errors import InputError
from onnxaccel.inputs import PreprocessRequest, prepare_feeds
from onnxaccel.prepost.detect import decode_yolov8, nms
from onnxaccel.image_geometry import letterbox
from onnxaccel.prepost.presets import resolve_preprocess, ultralytics_meta
from onnxaccel.prepost.topk import imagenet_labels, topk

LABELS = Path(__file__).parents[2] / "src" / "onnxaccel" / "prepost" / "imagenet_classes.txt"


def test_letterbox_keeps_the_aspect_and_pads_gray_and_undo_maps_back():
    img = Image.new("RGB", (300, 150), (255, 0, 0))
    boxed, lb = letterbox(img, 640, 640)
    # Ultralytics: r = min(640/150, 640/300) = 2.1333; unpadded 640x320; dh = 160 -> top = round(159.9) = 160
    assert (lb.scale, lb.left, lb.top) == (pytest.approx(640 / 300), 0, 160)
    arr = np.asarray(boxed)
    assert tuple(arr[10, 10]) == (114, 114, 114) and tuple(arr[320, 320]) == (255, 0, 0)
    back = lb.undo(np.array([[0.0, 160.0, 640.0, 480.0]]))
    np.testing.assert_allclose(back, [[0, 0, 300, 150]])


def test_nms_suppresses_overlaps_only_within_a_class():
    out = np.zeros((1, 6, 3), np.float32)
    out[0, :4] = np.array([[50, 52, 200], [50, 50, 50], [40, 40, 40], [40, 40, 40]], np.float32)
    out[0, 4] = [0.9, 0.8, 0.0]
    out[0, 5] = [0.0, 0.0, 0.7]
    dets = decode_yolov8(out, names={0: "a", 1: "b"})[0]
    assert [(d.label, round(d.score, 1)) for d in dets] == [("a", 0.9), ("b", 0.7)]
    assert list(nms(np.array([[0, 0, 10, 10], [0, 0, 10, 9], [20, 20, 30, 30]], float), 0.5)) == [0, 2]


def test_vendored_imagenet_labels_match_upstream_header():
    header = LABELS.read_text().splitlines()[0]
    assert "pytorch/hub" in header and "c7895df70c7767403e36f82786d6b611b7984557" in header
    labels = imagenet_labels()
    assert (labels[0], labels[1], labels[407], labels[999]) == ("tench", "goldfish", "ambulance", "toilet tissue")
    row = np.zeros((1, 1000), np.float32)
    row[0, 407] = 5
    assert topk(row, 1)[0][0].label == "ambulance"


def test_ultralytics_metadata_and_preset_choice(yolo_model):
    meta = ultralytics_meta(load_model(yolo_model).metadata)
    assert (meta.task, meta.imgsz, meta.stride, meta.names) == ("detect", (640, 640), 32, {0: "Normal", 1: "Fall"})
    pre = resolve_preprocess(load_model(yolo_model).metadata, None)
    assert (pre.preset, pre.size, pre.scale, pre.mean) == ("yolo", (640, 640), 1 / 255, (0.0, 0.0, 0.0))
    assert resolve_preprocess({}, None).preset == "none"
    with pytest.raises(InputError, match="--resize applies to the imagenet preset only"):
        resolve_preprocess({}, PreprocessRequest("yolo", resize=300))
    with pytest.raises(InputError, match="--preprocess must be one of"):
        PreprocessRequest("letterbox")


def test_image_binds_symbolic_height_width_rounded_to_the_stride(pretrained_det, tmp_path):
    Image.new("RGB", (100, 70), (10, 20, 30)).save(tmp_path / "a.png")
    fs = prepare_feeds(load_model(pretrained_det), [str(tmp_path / "a.png")], preprocess=PreprocessRequest("yolo"))
    assert fs.model.input_shapes["x"] == (1, 3, 96, 128)  # no imgsz metadata: image size up to 32
    assert fs.origins[0].image.letterbox is not None
    raw = prepare_feeds(load_model(pretrained_det), [str(tmp_path / "a.png")])
    assert raw.model.input_shapes["x"] == (1, 3, 70, 100)  # none: the image's own size
    np.testing.assert_allclose(raw.feeds["x"][0, :, 5, 5], [10, 20, 30])
    assert "choose one with --preprocess" in raw.origins[0].note
    bound = prepare_feeds(load_model(pretrained_det), [str(tmp_path / "a.png")], shapes={"x": (1, 3, 64, 64)},
                          preprocess=PreprocessRequest("scale01"))
    assert bound.feeds["x"].shape == (1, 3, 64, 64)  # --shape wins over the image's size



def test_imagenet_knobs_without_a_preset_ask_for_the_imagenet_pipeline():
    """--resize/--mean/--std are the imagenet preset's knobs: given alone, for a model whose metadata names no
    preset, they select imagenet (and say so), instead of being refused or applied to raw pixels."""
    pre = resolve_preprocess({}, PreprocessRequest(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), resize=52))
    assert (pre.preset, pre.mean, pre.resize) == ("imagenet", (0.5, 0.5, 0.5), 52) and "implied" in pre.origin
    assert resolve_preprocess({}, PreprocessRequest()).preset == "none"
    yolo = {"author": "Ultralytics", "task": "detect", "imgsz": "[640, 640]"}
    assert resolve_preprocess(yolo, PreprocessRequest()).preset == "yolo"


def test_optimize_says_how_calibration_images_were_fed(tmp_path, pretrained_cls, photo):
    data = tmp_path / "images"
    data.mkdir()
    shutil.copy(photo("page.png"), data / "page.png")
    result = CliRunner().invoke(app, ["optimize", str(pretrained_cls), "-o", str(tmp_path / "o.onnx"), "-t", "cpu",
                                      "--shape", "x=1x3x48x192", "--eval-data", str(data), "--preprocess", "scale01",
                                      "--no-compile-cache", "--json"])
    assert result.exit_code == 0, result.output
    notes = " ".join(json.loads(result.stdout)["notes"])
    assert "images in --calibration/--eval-data, if any, are fed as scale01" in notes and "--preprocess" in notes


def test_class_names_parse_the_common_metadata_forms_as_data_only(yolo_model, pretrained_rec):
    from onnxaccel.prepost.class_names import class_names, parse_names

    two = {0: "cat", 1: "dog"}
    assert parse_names("{0: 'cat', 1: 'dog'}") == two  # Ultralytics: a Python dict literal
    assert parse_names('{"0": "cat", "1": "dog"}') == two  # JSON object
    assert parse_names('["cat", "dog"]') == parse_names("['cat', 'dog']") == two  # JSON list, Python list
    assert parse_names("cat, dog") == parse_names("cat\ndog\n") == two  # separated
    for bad in ("__import__('os').system('true')", "{0: open('x')}", "42", "", "cat", "{'a': 'cat'}", "[[1]]"):
        assert parse_names(bad) is None, bad
    assert class_names({"classes": "a,b,c"}).names == {0: "a", 1: "b", 2: "c"}
    names = class_names(load_model(yolo_model).metadata)  # the real Ultralytics export
    assert (names.key, names.names) == ("names", {0: "Normal", 1: "Fall"})
    assert names.for_classes(2) == (("Normal", "Fall"), None) and names.for_classes(3)[0] is None
    # PP-OCR's recognizer lists its characters under 'character' without the CTC blank: not class names.
    assert class_names(load_model(pretrained_rec).metadata) is None
