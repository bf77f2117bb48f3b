"""`batch` binds the model's symbolic dims by the shapes of the files it reads (docs/SHAPES.md resolution order,
step 2), and runs files of different shapes in one job: grouped by shape, or padded to --shape-buckets. Real
pretrained PP-OCR models (rapidocr-onnxruntime): the direction classifier x[?,3,?,?] and the recognizer
x[?,3,?,W]."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from onnxaccel.cli.main import app

WIDTHS = (192, 256, 352)


def _batch(*args):
    return CliRunner().invoke(app, ["batch", *map(str, args)])


def _written(path, name):
    return pq.read_table(path).column(name).combine_chunks().to_numpy_ndarray()


def _direct(model, rows: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": rows})[0]


@pytest.fixture(scope="module")
def rec_rows(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rec")
    rng = np.random.default_rng(3)
    for width in WIDTHS:
        np.save(folder / f"w{width}.npy", rng.random((2, 3, 48, width), dtype=np.float32))
    return folder


def test_npy_files_bind_the_classifier_dims(pretrained_cls, tmp_path):
    """x[?,3,?,?] with no --shape: the files' 1x3x48x192 rows bind H and W (this stopped with "Symbolic
    dimensions left unbound" before)."""
    folder = tmp_path / "cls"
    folder.mkdir()
    rng = np.random.default_rng(0)
    rows = [rng.random((1, 3, 48, 192), dtype=np.float32) for _ in range(3)]
    for i, row in enumerate(rows):
        np.save(folder / f"crop{i}.npy", row)
    result = _batch(pretrained_cls, "-i", folder, "-o", tmp_path / "out", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["rows"]["done"] == 3
    assert [(e["shapes"]["x"][1:], e["rows"]) for e in report["shapes"]] == [([3, 48, 192], 3)]
    for i, row in enumerate(rows):
        written = _written(tmp_path / "out" / f"crop{i}.parquet", "save_infer_model/scale_0.tmp_1")
        np.testing.assert_allclose(written, _direct(pretrained_cls, row), atol=1e-5)


def test_rows_of_different_widths_run_grouped_by_shape(pretrained_rec, rec_rows, tmp_path):
    result = _batch(pretrained_rec, "-i", rec_rows, "-o", tmp_path / "out", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["rows"]["done"] == 6 and not report["errors"]
    assert sorted(e["shapes"]["x"][3] for e in report["shapes"]) == list(WIDTHS)
    assert all(e["padded_to"] is None for e in report["shapes"])
    assert any("3 shapes" in w for w in report["warnings"])
    for width in WIDTHS:
        rows = np.load(rec_rows / f"w{width}.npy")
        written = _written(tmp_path / "out" / f"w{width}.parquet", "softmax_11.tmp_0")
        np.testing.assert_allclose(written, _direct(pretrained_rec, rows), atol=1e-4)


def test_text_output_says_which_shapes_ran(pretrained_rec, rec_rows, tmp_path):
    result = _batch(pretrained_rec, "-i", rec_rows, "-o", tmp_path / "out")
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "shapes: x=8x3x48x192 (1 shard(s), 2 rows); x=8x3x48x256" in text


@pytest.mark.parametrize("dim", ["p2o.DynamicDimension.1", "x:3"])
def test_shape_buckets_pad_each_width_to_its_bucket(pretrained_rec, rec_rows, tmp_path, dim):
    result = _batch(pretrained_rec, "-i", rec_rows, "-o", tmp_path / "out", "--shape-buckets", f"{dim}=256,352",
                    "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["rows"]["done"] == 6
    padded = {e["shapes"]["x"][3]: (e["padded_to"] or e["shapes"])["x"][3] for e in report["shapes"]}
    assert padded == {192: 256, 256: 256, 352: 352}
    for width in (256, 352):  # rows already at a bucket's width: exactly the unpadded result
        rows = np.load(rec_rows / f"w{width}.npy")
        written = _written(tmp_path / "out" / f"w{width}.parquet", "softmax_11.tmp_0")
        np.testing.assert_allclose(written, _direct(pretrained_rec, rows), atol=1e-4)
    # The recognizer's output axis is W/8: cropped to what the unpadded width gives (192 / 8 = 24 steps).
    assert _written(tmp_path / "out" / "w192.parquet", "softmax_11.tmp_0").shape == (2, 192 // 8, 6625)


def test_shape_binds_one_axis_and_files_of_another_width_are_error_rows(pretrained_rec, rec_rows, tmp_path):
    """--shape INPUT:AXIS=SIZE wins over the files; the files it does not fit are error rows saying why."""
    result = _batch(pretrained_rec, "-i", rec_rows, "-o", tmp_path / "out", "--shape", "x:3=192", "--json")
    assert result.exit_code == 3, result.output
    report = json.loads(result.stdout)
    assert report["rows"]["done"] == 2 and len(report["errors"]) == 2
    assert all("--shape wins" in e["reason"] for e in report["errors"])
