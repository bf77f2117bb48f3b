"""Preprocessing inside the graph (issue 22): a model fed uint8 NHWC pixels with its preprocessing embedded
gives what the original gives fed the host-preprocessed float tensor of the same photographs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxaccel.errors import UsageError
from onnxaccel.inputs_files import ImagePreprocess, read_image, read_pixels
from onnxaccel.model import load_model
from onnxaccel.prepost.presets import preset_values
from onnxaccel.transform.embed_preprocess import embed_preprocess, embedded_of


def _session(proto_or_path):
    data = proto_or_path.SerializeToString() if isinstance(proto_or_path, onnx.ModelProto) else str(proto_or_path)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("preset", ["imagenet", "scale01"])
def test_zoo_classifier_embedded_equals_host_preprocessing(preset, photo, tmp_path):
    model = load_model("zoo:squeezenet")
    embedded, done = embed_preprocess(model.proto, preset)
    onnx.checker.check_model(embedded, full_check=True)
    path = tmp_path / "embedded.onnx"
    onnx.save(embedded, path)
    assert load_model(path).inputs[0].dtype == "uint8"  # reloads in onnxaccel itself
    spec = model.inputs[0]
    scale, mean, std = preset_values(preset)
    pre = ImagePreprocess(preset=preset, scale=scale, mean=mean, std=std)
    host, pixels = [], []
    for name in ("chelsea.png", "coffee.png", "astronaut.png"):
        host.append(read_image(photo(name), spec, (1, 3, 224, 224), pre)[0])
        pixels.append(read_pixels(photo(name), 224, 224, pre)[0][None])
    want = _session(model.path).run(None, {spec.name: np.concatenate(host)})[0]
    got = _session(embedded).run(None, {done.input: np.concatenate(pixels)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert embedded_of(embedded) == done and done.preset == preset


def test_yolo_detector_embedded_equals_host_letterbox(yolo_model, photo):
    model = load_model(yolo_model)
    embedded, done = embed_preprocess(model.proto, "yolo")
    onnx.checker.check_model(embedded, full_check=True)
    pre = ImagePreprocess(preset="yolo", scale=1 / 255.0, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    host = read_image(photo("astronaut.png"), model.inputs[0], (1, 3, 640, 640), pre)[0]
    pixels = read_pixels(photo("astronaut.png"), 640, 640, pre)[0][None]
    want = _session(model.path).run(None, {"images": host})[0]
    got = _session(embedded).run(None, {"images": pixels})[0]
    assert pixels.nbytes * 4 == host.nbytes  # a quarter of the bytes to move
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-2)


def test_refusals_name_the_problem(pretrained_det, silero_vad_model):
    with pytest.raises(UsageError, match="must be one of"):
        embed_preprocess(load_model(pretrained_det).proto, "none")
    with pytest.raises(UsageError, match="0 float NCHW 3-channel inputs"):
        embed_preprocess(load_model(silero_vad_model).proto, "scale01")
    once, _ = embed_preprocess(load_model(pretrained_det).proto, "scale01")
    with pytest.raises(UsageError, match="already has its preprocessing embedded"):
        embed_preprocess(once, "scale01")


def test_optimize_embed_preprocess_writes_a_checked_uint8_model(tmp_path, photo):
    """`optimize --embed-preprocess yolo` through the real CLI: the written model passes the full check, reloads,
    takes uint8 NHWC, says what it embedded in --json, and equals host preprocessing on a photograph."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "sq.onnx"
    proc = subprocess.run([str(Path(sys.executable).parent / "onnxaccel"), "optimize", "zoo:squeezenet", "-o",
                           str(out), "-t", "cpu", "--embed-preprocess", "scale01", "--no-compile-cache", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["embedded_preprocess"]["preset"] == "scale01" and report["embedded_preprocess"]["dtype"] == "uint8"
    assert report["embedded_preprocess"]["max_abs_diff_vs_host"] < 1e-4
    onnx.checker.check_model(str(out), full_check=True)
    model = load_model(out)
    assert model.inputs[0].dtype == "uint8" and embedded_of(model.proto).preset == "scale01"
    pre = ImagePreprocess(preset="scale01", scale=1 / 255.0, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    original = load_model("zoo:squeezenet")
    host = read_image(photo("coffee.png"), original.inputs[0], (1, 3, 224, 224), pre)[0]
    pixels = read_pixels(photo("coffee.png"), 224, 224, pre)[0][None]
    want = _session(original.path).run(None, {original.inputs[0].name: host})[0]
    got = _session(out).run(None, {model.inputs[0].name: pixels})[0]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
