"""Synthesized integer inputs stay within the range the graph gives them, and `run` says which range and why.

Issue 38 item 15: a byte-value classifier (Google's Magika: int32 byte values 0..256 feeding an embedding
Gather of 257 rows) got [0, 1000). The `magika` package is not installed in this environment and no packaged
model of the test fixtures has an integer index input, so the models here are small graphs built in place:
an embedding Gather(weights[257, 8], bytes int32) as Magika's, a OneHot of depth 10, and an integer input that
nothing bounds (the default range).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxaccel.cli.main import app
from onnxaccel.pipeline import prepare
from onnxaccel.target import parse_target

CPU = parse_target("cpu")


def _save(path, nodes, inputs, outputs, initializers):
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializers),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return str(path)


@pytest.fixture(scope="module")
def byte_embedding(tmp_path_factory):
    """Magika-like: int32 byte values [batch, 1536] -> Cast -> Gather over a 257-row embedding (built here)."""
    weights = numpy_helper.from_array(np.random.default_rng(0).random((257, 8), dtype=np.float32), "emb_weight")
    return _save(tmp_path_factory.mktemp("bytes") / "bytes.onnx",
                 [helper.make_node("Cast", ["bytes"], ["ids"], to=TensorProto.INT64),
                  helper.make_node("Gather", ["emb_weight", "ids"], ["y"], axis=0, name="embedding")],
                 [helper.make_tensor_value_info("bytes", TensorProto.INT32, ["batch", 1536])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1536, 8])], [weights])


def test_byte_values_lie_within_the_embedding_rows_and_run_says_why(byte_embedding):
    prepared = prepare(byte_embedding, CPU, batch=4)
    values = prepared.feeds["bytes"]
    assert values.min() >= 0 and values.max() < 257 and values.max() > 200  # the whole 0..256 range is used
    assert prepared.run()["y"].shape == (4, 1536, 8)
    result = CliRunner().invoke(app, ["run", byte_embedding, "-t", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    detail = json.loads(result.stdout)["inputs"][0]["detail"]
    assert detail.startswith("integers in [0, 257)") and "Gather 'embedding' over 257 rows of 'emb_weight'" in detail
    text = CliRunner().invoke(app, ["run", byte_embedding, "-t", "cpu"], terminal_width=240)
    assert text.exit_code == 0, text.output
    assert "Gather 'embedding' over 257 rows" in text.output
    given = prepare(byte_embedding, CPU, value_ranges={"bytes": (0, 3)}, batch=2)  # --value-range still wins
    assert set(np.unique(given.feeds["bytes"])) <= {0, 1, 2, 3} and "--value-range" in given.synthesized[0].detail


def test_one_hot_indices_lie_within_its_depth(tmp_path):
    """Out of [0, depth) OneHot gives an all-zero row, silently: [0, 1000) made nearly every row zero."""
    path = _save(tmp_path / "onehot.onnx",
                 [helper.make_node("OneHot", ["label", "depth", "values"], ["y"], name="onehot")],
                 [helper.make_tensor_value_info("label", TensorProto.INT64, [64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 10])],
                 [numpy_helper.from_array(np.array(10, np.int64), "depth"),
                  numpy_helper.from_array(np.array([0, 1], np.float32), "values")])
    prepared = prepare(path, CPU)
    assert prepared.feeds["label"].min() >= 0 and prepared.feeds["label"].max() < 10
    assert "OneHot 'onehot' of depth 10" in prepared.synthesized[0].detail
    assert (prepared.run()["y"].sum(axis=1) == 1).all()  # one hot in every row


def test_unbounded_integer_input_reports_the_default_range(tmp_path):
    path = _save(tmp_path / "count.onnx",
                 [helper.make_node("Cast", ["count"], ["y"], to=TensorProto.FLOAT)],
                 [helper.make_tensor_value_info("count", TensorProto.INT32, [3])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [])
    result = CliRunner().invoke(app, ["run", path, "-t", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    detail = json.loads(result.stdout)["inputs"][0]["detail"]
    assert detail.startswith("integers in [0, 1000) (the default range")
    assert "--value-range count=LOW,HIGH" in detail
