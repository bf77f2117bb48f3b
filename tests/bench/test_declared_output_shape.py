"""A model whose declared output shape is not what it returns (issue 38, item 9): declared ``[1, seqlen]``, returned
``3x1x16``. ONNX Runtime reuses an output bound by device from the first run and then checks it against the
declared shape, so the second IO-bound run fails ("Invalid rank for output") unless the output is bound anew."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxaccel import load_model
from onnxaccel.cli.main import app
from onnxaccel.engines import compile_model
from onnxaccel.engines.ort_binding import inference_error
from onnxaccel.inputs import FeedOrigin, synthesize
from onnxaccel.pipeline import explain_failure
from onnxaccel.target import parse_target

RETURNED = (3, 1, 16)


def make_lying_output_model(path):
    """x[1, 8] -> Tile -> Reshape to a shape whose length depends on x's values (zero times x), so that neither
    onnx's nor ONNX Runtime's shape inference knows the rank: y returns 3x1x16 but is declared [1, seqlen]."""
    def const(name, value, dtype=np.int64):
        return numpy_helper.from_array(np.array(value, dtype=dtype), name)
    nodes = [
        helper.make_node("Tile", ["x", "reps"], ["t"]),  # 1x48
        helper.make_node("Mul", ["x", "fzero"], ["z"]),
        helper.make_node("ReduceMax", ["z"], ["zmax"], keepdims=0),
        helper.make_node("Cast", ["zmax"], ["zint"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["zint", "one_d"], ["z1"]),
        helper.make_node("Add", ["z1", "three"], ["end"]),  # [3], known only at run time
        helper.make_node("Slice", ["dims", "zero", "end"], ["target"]),  # [3, 1, 16]
        helper.make_node("Reshape", ["t", "target"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "lying_output",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seqlen"])],
        initializer=[const("reps", [1, 6]), const("dims", [*RETURNED, 0]), const("zero", [0]),
                     const("three", [3]), const("fzero", 0.0, np.float32), const("one_d", [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def lying_path(tmp_path_factory):
    return make_lying_output_model(tmp_path_factory.mktemp("models") / "lying-output.onnx")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def test_plain_onnxruntime_fails_the_second_bound_run(lying_path):
    """The precondition: ONNX Runtime itself refuses to reuse the output bound by the first run."""
    session = ort.InferenceSession(str(lying_path), providers=["CPUExecutionProvider"])
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(np.ones((1, 8), np.float32)))
    binding.bind_output("y", "cpu")
    session.run_with_iobinding(binding)
    assert binding.get_outputs()[0].shape() == list(RETURNED)
    with pytest.raises(Exception, match="Invalid rank for output: y"):
        session.run_with_iobinding(binding)


@pytest.mark.parametrize("iobinding", [[], ["--iobinding", "on"], ["--iobinding", "off"]])
def test_bench_measures_the_model(lying_path, iobinding):
    result = invoke("bench", str(lying_path), "--target", "cpu", "--runs", "5", *iobinding, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["summary"]["ok"] == 1 and report["summary"]["failed"] == 0
    (cell,) = report["cells"]
    assert cell["iobinding"] is (iobinding != ["--iobinding", "off"])  # on is bench's default
    assert cell["throughput_items_per_s"] > 0 and cell["latency"]["count"] == 5


def test_bench_table_reports_a_throughput(lying_path):
    result = invoke("bench", str(lying_path), "--target", "cpu", "--runs", "5")
    assert result.exit_code == 0, result.stderr
    assert "items/s" in result.stdout and "FAILED" not in result.stdout


def test_run_with_iobinding(lying_path):
    result = invoke("run", str(lying_path), "--target", "cpu", "--iobinding")
    assert result.exit_code == 0, result.stderr
    assert "3x1x16" in result.stdout


def test_bound_run_rebinds_the_contradicted_output_and_gives_the_host_values(lying_path):
    runner = compile_model(load_model(lying_path).bind({}), parse_target("cpu"))
    feeds = synthesize(runner.model, seed=1)
    expected = runner.run(feeds)["y"]
    bound = runner.bind(feeds)
    for _ in range(4):
        bound.run()
        np.testing.assert_array_equal(bound.outputs()["y"], expected)
    assert bound.untrusted == {"y": ("[1, seqlen]", RETURNED)}


def test_outputs_that_keep_their_declared_shape_stay_bound_once(mlp_path):
    runner = compile_model(load_model(mlp_path).bind({"batch": (2,)}), parse_target("cpu"))
    bound = runner.bind(synthesize(runner.model, seed=1))
    bound.run()
    bound.run()
    assert bound.untrusted == {}


def test_a_run_that_still_fails_says_the_declared_shape_is_wrong_not_the_inputs(lying_path):
    """Outputs bound to fixed OrtValues (as for a CUDA graph) cannot be bound anew: the error names the output,
    its declared and returned shape, keeps ONNX Runtime's words, and no hint blames synthesized values."""
    runner = compile_model(load_model(lying_path).bind({}), parse_target("cpu"))
    feeds = synthesize(runner.model, seed=1)
    bound = runner.bind(feeds, fixed_outputs={"y": (RETURNED, np.float32)})
    with pytest.raises(Exception) as caught:
        bound.run()
    error = explain_failure(caught.value, [FeedOrigin("x", "synthesized", "uniform in [0, 1)", (1, 8), "float32")])
    assert "declares output 'y' as [1, seqlen]" in error.message
    assert "Invalid rank for output: y Got: 3 Expected: 2" in error.message and "Invalid rank" in error.details
    assert "Random values" not in (error.hint or "") and "declared output shape" in error.hint


def test_the_message_gives_the_returned_shape_when_an_earlier_run_saw_it(lying_path):
    outputs = load_model(lying_path).outputs
    exc = RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for output: y for the "
                       "following indices\n index: 0 Got: 3 Expected: 1\n Please fix either the inputs/outputs or "
                       "the model.")
    error = inference_error(parse_target("cpu"), exc, outputs, {"y": ("[1, seqlen]", RETURNED)})
    assert "declares output 'y' as [1, seqlen] but returns 3x1x16" in error.message
    assert error.explained and error.details == str(exc)
