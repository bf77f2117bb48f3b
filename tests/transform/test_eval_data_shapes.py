"""`optimize --eval-data`: the data's shapes bind the symbolic dims (step 2 of the resolution order)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from onnxaccel.cli.main import app
from onnxaccel.model import load_model
from onnxaccel.transform.data_shapes import data_shapes

pytest.importorskip("onnxruntime")


def test_eval_data_binds_the_ppocr_detector(pretrained_det, tmp_path):
    # Two samples of one 96x128 image each, stacked on a new axis 0; the model declares x[?, 3, ?, ?].
    data = tmp_path / "eval.npz"
    np.savez(data, x=np.random.default_rng(0).random((2, 1, 3, 96, 128), dtype=np.float32))
    out = tmp_path / "det.onnx"
    result = CliRunner().invoke(app, ["optimize", str(pretrained_det), "-o", str(out), "-t", "cpu", "--eval-data",
                                      str(data), "--no-compile-cache", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["accuracy"]["samples"] == {"source": str(data), "count": 2, "synthetic": False,
                                                 "shapes": {"x": [[1, 3, 96, 128]]}}
    assert f"shapes from {data}: x=1x3x96x128 (--shape overrides)" in report["notes"]
    assert out.is_file()


def test_data_shapes_yield_to_explicit_shapes(pretrained_det, tmp_path):
    model = load_model(pretrained_det)
    data = tmp_path / "eval.npz"
    np.savez(data, x=np.zeros((4, 3, 96, 128), np.float32))
    assert data_shapes(str(data), model, {}, None) == {"x": (1, 3, 96, 128)}  # rows along the batch axis
    assert data_shapes(str(data), model, {}, 2) == {"x": (2, 3, 96, 128)}
    assert data_shapes(str(data), model, {"x": (1, 3, 64, 64)}, None) == {}
    np.savez(data, x=np.zeros((4, 1, 96, 128), np.float32))  # 1 channel: does not fit, left to the loader
    assert data_shapes(str(data), model, {}, None) == {}
