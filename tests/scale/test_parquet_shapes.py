"""`batch` binds the model's symbolic dims by the row shapes of parquet tensor columns, as it does by .npy/.npz
headers (docs/SHAPES.md resolution order, step 2): `fixed_shape_tensor` columns of PP-OCR recognizer crops
(x[?,3,?,W], rapidocr-onnxruntime) and list<int64> token columns for zoo:bert-tiny, files of different shapes
grouped by shape."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from onnxaccel.cli.main import app
from onnxaccel.engines import compile_model
from onnxaccel.model import load_model
from onnxaccel.target import parse_target


def _batch(*args):
    return CliRunner().invoke(app, ["batch", *map(str, args)])


def _written(path, name):
    return pq.read_table(path).column(name).combine_chunks().to_numpy_ndarray()


def test_fixed_shape_tensor_columns_bind_the_recognizer_width(pretrained_rec, tmp_path):
    folder = tmp_path / "crops"
    folder.mkdir()
    rng = np.random.default_rng(5)
    rows = {width: rng.random((2, 3, 48, width), dtype=np.float32) for width in (192, 256)}
    for width, value in rows.items():
        pq.write_table(pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(value)}),
                       folder / f"w{width}.parquet")
    result = _batch(pretrained_rec, "-i", folder, "-o", tmp_path / "out", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["rows"]["done"] == 4 and not report["errors"]
    assert sorted(e["shapes"]["x"][1:] for e in report["shapes"]) == [[3, 48, 192], [3, 48, 256]]
    session = ort.InferenceSession(str(pretrained_rec), providers=["CPUExecutionProvider"])
    for width, value in rows.items():
        written = _written(tmp_path / "out" / f"w{width}.parquet", "softmax_11.tmp_0")
        np.testing.assert_allclose(written, session.run(None, {"x": value})[0], atol=1e-4)


def _tokens(path, ids: list[list[int]]) -> None:
    column = pa.array(ids, type=pa.list_(pa.int64()))
    ones = pa.array([[1] * len(r) for r in ids], type=pa.list_(pa.int64()))
    zeros = pa.array([[0] * len(r) for r in ids], type=pa.list_(pa.int64()))
    pq.write_table(pa.table({"input_ids": column, "attention_mask": ones, "token_type_ids": zeros}), path)


def test_list_columns_bind_the_sequence_length(tmp_path):
    """list<int64> token ids of 20 and 40 per row, one length per file: `sequence` bound by each file (over the
    zoo's metadata default of 128), no padding, the unpadded results."""
    folder = tmp_path / "tokens"
    folder.mkdir()
    rng = np.random.default_rng(9)
    ids = {length: rng.integers(1, 1000, (3, length)).astype(np.int64) for length in (20, 40)}
    for length, value in ids.items():
        _tokens(folder / f"len{length}.parquet", value.tolist())
    result = _batch("zoo:bert-tiny", "-i", folder, "-o", tmp_path / "out", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert sorted(e["shapes"]["input_ids"][1] for e in report["shapes"]) == [20, 40]
    for length, value in ids.items():
        model = load_model("zoo:bert-tiny").bind({"sequence": (length,)}, batch=3)
        feeds = {"input_ids": value, "attention_mask": np.ones_like(value), "token_type_ids": np.zeros_like(value)}
        with compile_model(model, parse_target("cpu")) as plain:
            expected = plain.run(feeds)["last_hidden_state"]
        written = _written(tmp_path / "out" / f"len{length}.parquet", "last_hidden_state")
        np.testing.assert_allclose(written, expected, atol=1e-4, rtol=1e-4)


def test_rows_of_different_lengths_in_one_file_are_an_error_shard(tmp_path):
    folder = tmp_path / "tokens"
    folder.mkdir()
    _tokens(folder / "mixed.parquet", [[5] * 20, [6] * 30])
    _tokens(folder / "even.parquet", [[5] * 20, [6] * 20])
    result = _batch("zoo:bert-tiny", "-i", folder, "-o", tmp_path / "out", "--json")
    assert result.exit_code == 3, result.output
    report = json.loads(result.stdout)
    assert report["rows"]["done"] == 2
    [error] = report["errors"]
    assert "mixed.parquet" in error["file"] and "20 and 30" in error["reason"]
