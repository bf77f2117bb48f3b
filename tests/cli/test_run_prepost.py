"""`run` with pre/post-processing on real pretrained models: YOLOv8 on a real photograph (boxes land on the
person), ImageNet top-k with labels, PP-OCR det binding its symbolic H/W from the image, top-k
naming classes from the model's metadata, and the rank-mismatch error reported as such."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from PIL import Image
from typer.testing import CliRunner

from onnxaccel.cli.main import app
from onnxaccel.prepost.detect import box_iou

runner = CliRunner()

#: The astronaut in scikit-image's astronaut.png (512x512), read off the image drawn by `run --draw`: hair
#: at the top (y ~ 15), the suit's left arm (x ~ 20) and right shoulder (x ~ 365), cut by the bottom edge.
ASTRONAUT = (20.0, 15.0, 365.0, 512.0)


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_yolo_detect_finds_the_astronaut_and_draws_it(yolo_model, photo, tmp_path):
    drawn = tmp_path / "out.jpg"
    args = ["run", str(yolo_model), "-t", "cpu", "--input", str(photo("astronaut.png")), "--preprocess", "yolo",
            "--postprocess", "detect", "--draw", str(drawn)]
    text = invoke(*args)
    assert text.exit_code == 0, text.output
    assert "preprocess yolo, letterbox pad 114" in text.output and "letterbox scale 1.25, offset 0,0" in text.output
    assert "Normal" in text.output and "detections drawn on" in text.output
    data = json.loads(invoke(*args, "--json", "--conf", "0.3").output)
    pre = data["preprocess"]["images"]
    assert pre["preset"] == "yolo" and pre["pad_value"] == 114 and pre["mean"] == [0, 0, 0]
    assert pre["letterbox"] == {"scale": 1.25, "offset": [0, 0], "original_size": [512, 512]}
    assert pre["fed_size"] == [640, 640] and data["inputs"][0]["preprocess"] == pre
    dets = data["postprocess"]["detections"][0]
    assert data["postprocess"]["kind"] == "detect" and data["postprocess"]["params"] == {"conf": 0.3, "iou": 0.45}
    assert [d["class"] for d in dets] == ["Normal"]  # one person at conf 0.3
    assert 0.55 < dets[0]["score"] < 0.63
    assert box_iou(np.array([dets[0]["box"]]), np.array([ASTRONAUT]))[0, 0] > 0.5
    with Image.open(drawn) as out, Image.open(photo("astronaut.png")) as src:
        assert out.size == src.size
        assert np.abs(np.asarray(out.convert("RGB"), np.int16) - np.asarray(src.convert("RGB"), np.int16)).max() > 100


def test_yolo_defaults_come_from_ultralytics_metadata(yolo_model, photo):
    data = json.loads(invoke("run", str(yolo_model), "-t", "cpu", "--input", str(photo("astronaut.png")),
                             "--json").output)
    assert data["preprocess"]["images"]["preset"] == "yolo"
    assert data["preprocess"]["images"]["origin"] == "Ultralytics metadata task=detect"
    assert data["postprocess"]["kind"] == "detect" and data["postprocess"]["detections"][0][0]["class"] == "Normal"


def test_imagenet_topk_with_labels_on_a_zoo_classifier(photo):
    # The zoo's weights are seeded random (not pretrained): the labels are checked, not which class wins.
    data = json.loads(invoke("run", "zoo:squeezenet", "-t", "cpu", "--input", str(photo("chelsea.png")),
                             "--json").output)
    pre = next(iter(data["preprocess"].values()))
    assert pre["preset"] == "imagenet" and pre["origin"] == "model metadata onnxaccel.preprocess=imagenet"
    assert pre["fed_size"] == [224, 224] and pre["crop"] is not None and pre["mean"] == [0.485, 0.456, 0.406]
    post = data["postprocess"]
    assert post["kind"] == "topk" and len(post["topk"][0]) == 5
    from onnxaccel.prepost.topk import imagenet_labels
    assert all(r["label"] == imagenet_labels()[r["index"]] for r in post["topk"][0])


def test_ppocr_det_binds_height_and_width_from_the_image(pretrained_det, photo):
    with Image.open(photo("page.png")) as img:
        width, height = img.size
    data = json.loads(invoke("run", str(pretrained_det), "-t", "cpu", "--input", str(photo("page.png")),
                             "--preprocess", "scale01", "--json").output)
    shape = data["input_shapes"]["x"]
    assert shape == [1, 3, -(-height // 32) * 32, -(-width // 32) * 32]
    assert data["preprocess"]["x"]["preset"] == "scale01" and data["outputs"][0]["shape"][2:] == shape[2:]


def test_an_image_without_preset_metadata_is_fed_raw_with_a_note(pretrained_det, photo):
    result = invoke("run", str(pretrained_det), "-t", "cpu", "--input", str(photo("page.png")), "--json")
    data = json.loads(result.output)
    assert data["preprocess"]["x"]["preset"] == "none" and data["preprocess"]["x"]["scale"] == 1.0
    assert any("choose one with --preprocess imagenet|yolo|scale01|none" in w for w in data["warnings"])


def test_rank_mismatch_is_reported_before_unbound_dims(silero_vad_model, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 2, 512), np.float32))
    result = invoke("run", str(silero_vad_model), "-t", "cpu", "--input", f"input={tmp_path / 'x.npy'}")
    assert result.exit_code != 0
    assert "expects rank 2" in result.output and "unbound" not in result.output


def test_help_shows_the_defaults_of_mean_std_resize():
    text = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "2000"}).output
    assert "0.485,0.456,0.406 for imagenet" in text and "0.229,0.224,0.225" in text
    assert "256 for a 224 crop" in text and "--preprocess" in text and "--postprocess" in text


def _with_names(model: Path, out: Path, **props: str) -> Path:
    """A copy of ``model`` with ``props`` added to its metadata_props."""
    proto = onnx.load(str(model))
    onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props}, **props})
    onnx.save(proto, str(out))
    return out


def test_topk_shows_class_names_from_the_model_metadata(pretrained_cls, tmp_path):
    """None of the packaged classifiers carries class names (RapidOCR's text-direction classifier has no
    metadata_props at all; its labels 0/180 live in RapidOCR's config), so this is a copy of that real
    classifier with an Ultralytics-style ``names`` entry added: "{0: 'upright', 1: 'upside_down'}"."""
    model = _with_names(pretrained_cls, tmp_path / "cls.onnx", names="{0: 'upright', 1: 'upside_down'}")
    args = ["run", str(model), "-t", "cpu", "--shape", "x=1x3x48x192", "--postprocess", "topk"]
    text = invoke(*args)
    assert text.exit_code == 0, text.output
    assert "0 (upright): " in text.output and "1 (upside_down): " in text.output
    assert "class names from metadata 'names'" in text.output
    post = json.loads(invoke(*args, "--json").output)["postprocess"]
    assert post["kind"] == "topk" and post["labels"] == "metadata 'names'" and post["notes"] == []
    ranked = post["topk"][0]
    assert sorted((r["index"], r["label"]) for r in ranked) == [(0, "upright"), (1, "upside_down")]
    assert abs(sum(r["probability"] for r in ranked) - 1) < 1e-3
    # Without --postprocess the names choose top-k: an [N, 2] output and two names.
    default = json.loads(invoke(*args[:-2], "--json").output)["postprocess"]
    assert default["kind"] == "topk" and default["origin"] == "a [N, 2] output (save_infer_model/scale_0.tmp_1) " \
        "named by metadata 'names'"


def test_topk_shows_indices_with_a_note_when_the_names_do_not_match(pretrained_cls, tmp_path):
    """A copy of the packaged text-direction classifier (2 classes) with 4 names (a JSON list under
    ``labels``, as a 0/90/180/270 orientation classifier would carry): indices only, and a note says why."""
    model = _with_names(pretrained_cls, tmp_path / "cls4.onnx", labels='["0", "90", "180", "270"]')
    args = ["run", str(model), "-t", "cpu", "--shape", "x=1x3x48x192", "--postprocess", "topk"]
    post = json.loads(invoke(*args, "--json").output)["postprocess"]
    assert post["labels"] is None and all(r["label"] is None for r in post["topk"][0])
    assert post["notes"] == ["the model's metadata 'labels' holds 4 class name(s) (indices 0..3), but the output "
                             "has 2 classes: showing class indices only"]
    text = invoke(*args).output
    assert "showing class indices only" in text and "(upright)" not in text
