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
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        pytest.fail("rapidocr-onnxruntime is not installed: run the tests with `make test`, which installs it")
    return Path(spec.origin).parent / "models"


@pytest.fixture(scope="session")
def pretrained_cls(pretrained_dir) -> Path:
    """Text-direction classifier: x[N,3,48,192] float -> [N,2] softmax (0 or 180 degrees)."""
    return pretrained_dir / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


@pytest.fixture(scope="session")
def pretrained_det(pretrained_dir) -> Path:
    """Text detector (DB, PP-OCRv4): x[N,3,H,W] -> probability map [N,1,H,W]."""
    return pretrained_dir / "ch_PP-OCRv4_det_infer.onnx"
