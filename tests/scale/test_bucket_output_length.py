"""Shape buckets crop an output axis that follows a padded input dim back to the length the unpadded input gives,
also where that axis is not the input dim itself: the PP-OCR recognizer (rapidocr-onnxruntime) x[N,3,48,W] ->
[N, W/8, 6625]. A symbolic output axis whose size is no known function of the inputs is named in a warning."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from onnxaccel.cli.main import app
from onnxaccel.engines.buckets import ShapeBuckets
from onnxaccel.model import load_model

OUTPUT = "softmax_11.tmp_0"


def _direct(model, rows: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": rows})[0]


@pytest.mark.parametrize("width", [192, 193, 200, 255])
def test_recognizer_steps_are_cropped_to_the_unpadded_width(pretrained_rec, width):
    """Padded to 256 the model gives 32 steps; the crop gives what the unpadded width gives (24 for 192)."""
    model = load_model(str(pretrained_rec)).bind({"x": (1, 3, 48, 256)})
    buckets = ShapeBuckets.parse("x:3=256,352")
    rows = np.random.default_rng(width).random((1, 3, 48, width), dtype=np.float32)
    padded = _direct(pretrained_rec, buckets.pad(model, {"x": rows}, (256,))["x"])
    assert padded.shape == (1, 32, 6625)
    cropped = buckets.crop(model, {OUTPUT: padded}, (256,), {"x:3": width})[OUTPUT]
    unpadded = _direct(pretrained_rec, rows)
    assert cropped.shape == unpadded.shape
    if width == 192:
        assert cropped.shape == (1, 24, 6625)
    np.testing.assert_array_equal(cropped, padded[:, :unpadded.shape[1]])
    assert buckets.uncropped_note(model) is None


def test_batch_writes_the_unpadded_number_of_steps(pretrained_rec, tmp_path):
    """`batch --shape-buckets`: 192-wide rows in the 256 bucket come back with 24 steps, 300-wide rows in the 352
    bucket with 37. The values are the padded run's: the recognizer attends along the width, so they differ from
    an unpadded run everywhere (not only near the end), while the best class of nearly every step agrees."""
    rng = np.random.default_rng(3)
    folder = tmp_path / "rows"
    folder.mkdir()
    rows = {width: rng.random((2, 3, 48, width), dtype=np.float32) for width in (192, 300)}
    for width, value in rows.items():
        np.save(folder / f"w{width}.npy", value)
    result = CliRunner().invoke(app, ["batch", str(pretrained_rec), "-i", str(folder), "-o", str(tmp_path / "out"),
                                      "--shape-buckets", "x:3=256,352", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["rows"]["done"] == 4 and not report["errors"]
    assert not any("no size known" in w for w in report["warnings"])
    for width, steps in ((192, 24), (300, 37)):
        written = pq.read_table(tmp_path / "out" / f"w{width}.parquet").column(OUTPUT)
        written = written.combine_chunks().to_numpy_ndarray()
        unpadded = _direct(pretrained_rec, rows[width])
        assert written.shape == unpadded.shape == (2, steps, 6625)
        assert (written.argmax(-1) == unpadded.argmax(-1)).mean() >= 0.9


def test_an_output_axis_of_unknown_size_is_named_and_kept(tmp_path):
    """NonZero's count depends on the data, not on the input dims: the note names the axis, and the crop leaves it."""
    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"])], "nz",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "length"])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [2, "count"])])
    path = tmp_path / "nonzero.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = load_model(str(path))
    buckets = ShapeBuckets.parse("length=8,16")
    note = buckets.uncropped_note(model)
    assert note is not None and "y:1" in note and "bucket's length" in note
    value = np.zeros((2, 11), dtype=np.int64)  # 11 values found in a row padded from 5 to 16
    assert buckets.crop(model, {"y": value}, (16,), {"length": 5})["y"].shape == (2, 11)
