"""Synthesized ``axes`` inputs are distinct axes of their data, so the model runs.

ONNX's node cases whose ReduceX (opset 18), ReduceSum (13), Squeeze/Unsqueeze (13), Pad (18) or Slice take
``axes`` as a graph input: with the default integer range [0, 1000) most failed in ONNX Runtime on synthesized
inputs (an axis out of range, a repeated axis); drawn as distinct axes of the data's rank (of the output's for
Unsqueeze, of the axes of size 1 for Squeeze), every one of them runs, and `run` says how the axes were drawn.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from onnxaccel.cli.main import app
from onnxaccel.model import load_model
from onnxaccel.synthesis import _AXES_OPS, synthesize, synthesize_described


def _axes_inputs(model: onnx.ModelProto) -> set[str]:
    inputs = {i.name for i in model.graph.input}
    found = set()
    for node in model.graph.node:
        pos = _AXES_OPS.get(node.op_type, (None,))[0]
        if pos is not None and len(node.input) > pos and node.input[pos] in inputs:
            found.add(node.input[pos])
    return found


@pytest.fixture(scope="module")
def axes_cases(node_dir):
    cases = []
    for path in sorted(node_dir.glob("*/model.onnx")):
        names = _axes_inputs(onnx.load(path, load_external_data=False))
        if names:
            cases.append((path, names))
    assert len(cases) >= 100, f"only {len(cases)} node cases with an axes input: the suite changed"
    return cases


def test_every_node_case_with_an_axes_input_runs_on_synthesized_inputs(axes_cases):
    failed = []
    for path, names in axes_cases:
        feeds = synthesize(load_model(str(path)))
        for name in names:
            axes = np.asarray(feeds[name]).reshape(-1)
            assert len(set(axes.tolist())) == axes.size, (path.parent.name, name, axes)  # distinct
        try:
            ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
        except Exception as exc:  # noqa: BLE001 - collected and shown together
            failed.append(f"{path.parent.name}: {str(exc).splitlines()[0][:160]}")
    assert not failed, "\n".join(failed)


def test_squeeze_axes_are_the_data_axes_of_size_one(node_dir):
    model = load_model(str(node_dir / "test_squeeze" / "model.onnx"))  # x [1, 3, 4, 5], axes [1]
    described = synthesize_described(model)
    value, how = described["axes"]
    assert value.tolist() == [0] and "size 1" in how


def test_run_says_how_the_axes_were_drawn(node_dir):
    path = node_dir / "test_reduce_sum_keepdims_random" / "model.onnx"
    result = CliRunner().invoke(app, ["run", str(path), "-t", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    text = json.dumps(json.loads(result.stdout))
    assert "distinct integers of [0, 1, 2]" in text and "axes of ReduceSum" in text


def test_squeeze_with_no_axis_of_size_one_says_so(tmp_path):
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Squeeze", ["x", "axes"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3]),
         onnx.helper.make_tensor_value_info("axes", onnx.TensorProto.INT64, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])])
    path = tmp_path / "squeeze.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)]), path)
    _, how = synthesize_described(load_model(str(path)))["axes"]
    assert "no axis of size 1" in how and "--input axes=" in how
