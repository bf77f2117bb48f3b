"""A tensor .pb given for a sequence input (issue 38, item 8): refused with the reason, not run on the empty
sequence its bytes also parse as; a SequenceProto .pb still runs. ONNX's own backend node case and ORT."""

from __future__ import annotations

from typer.testing import CliRunner

from onnxaccel import load_model
from onnxaccel.cli.main import app
from onnxaccel.inputs import load_feeds
from onnxaccel.protobuf_values import read_pb
from tests.core.test_input_types import case_dir

CASE = ("sequence_map", "test_sequence_map_identity_1_sequence_1_tensor")  # x0: seq(tensor(float)), x1: tensor


def test_tensor_pb_for_a_sequence_input_is_refused(tmp_path):
    path, items, _ = case_dir(tmp_path, *CASE)
    tensor_pb = items[1].split("=", 1)[1]  # x1's TensorProto (float32 [2]): its bytes parse as an empty sequence
    result = CliRunner().invoke(app, ["run", str(path), "--target", "cpu", "--input", f"x0={tensor_pb}",
                                      "--input", items[1]])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output  # no traceback
    text = " ".join(result.output.split())
    assert "Traceback" not in text
    for part in ("holds a TensorProto", "float32 [2]", "input 'x0' (seq(tensor(float))) is a sequence",
                 "SequenceProto", "from_list", "input_1.pb"):
        assert part in text, text
    model = load_model(path)
    assert read_pb(items[0].split("=", 1)[1], model.inputs[0].type_proto)[0].dtype.name == "float32"


def test_sequence_pb_still_runs(tmp_path):
    path, items, expected = case_dir(tmp_path, *CASE)
    _, feeds = load_feeds(load_model(path), items)
    assert isinstance(feeds["x0"], list) and len(feeds["x0"]) == len(expected[0]) > 0
    result = CliRunner().invoke(app, ["run", str(path), "--target", "cpu", "--json",
                                      *[a for item in items for a in ("--input", item)]])
    assert result.exit_code == 0, result.output
    assert '"y0"' in result.output and "seq" in result.output


def test_tensor_pb_for_an_int64_sequence_names_the_tensor(tmp_path):
    """int64 data: the bytes fail as a sequence ("element type not supported" before); now the same reason."""
    path, items, _ = case_dir(tmp_path, "sequenceinsert", "test_sequence_insert_at_back")
    result = CliRunner().invoke(app, ["run", str(path), "--target", "cpu", "--input",
                                      f"sequence={items[1].split('=', 1)[1]}", "--input", items[1]])
    text = " ".join(result.output.split())
    assert result.exit_code != 0 and "holds a TensorProto" in text and "input 'sequence'" in text, text
