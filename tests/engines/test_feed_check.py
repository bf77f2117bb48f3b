"""Feeds are checked once, in the runner (feeds_check.FeedCheck, called by the Runner template): names, element
types and ranks, with an error that says what does not fit, once per signature; the checks passed are not
repeated on the timed path."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxaccel.engines import compile_model
from onnxaccel.feeds_check import FeedCheck, FeedProblem
from onnxaccel.errors import InputError
from onnxaccel.model import load_model
from onnxaccel.target import parse_target


@pytest.fixture(scope="module")
def runner(mlp_path):
    made = compile_model(load_model(str(mlp_path)).bind(batch=1), parse_target("cpu"))
    yield made
    made.close()


@pytest.mark.parametrize("feeds,message,hint", [
    ({"x": np.ones((1, 4), np.float32), "y": np.ones(1)}, "Unknown input name(s): y.", "The model's inputs are: x."),
    ({}, "No value for input(s): x.", "every input of the model: x"),
    ({"x": np.ones((1, 4), np.float64)}, "Input 'x' expects float32; the value given is float64.",
     "astype(np.float32)"),
    ({"x": np.ones(4, np.float32)}, "Input 'x' expects rank 2 [batch, 4]; the value given has shape [4].", "Reshape"),
])
def test_a_runner_refuses_feeds_that_do_not_fit_and_says_what(runner, feeds, message, hint):
    with pytest.raises(InputError) as err:
        runner.run(feeds)
    assert err.value.message == message and hint in err.value.hint
    with pytest.raises(InputError) as err:
        runner.bind(feeds)
    assert err.value.message == message


def test_a_signature_is_checked_once_and_unchecked_runs_pay_no_check(runner, monkeypatch):
    """run() checks every call, but a signature that passed costs a lookup (the batch size is not part of it);
    run_unchecked (serve, the pool) checks nothing on runs the runtime takes and words the ones it refuses."""
    calls = []
    real = FeedCheck.problem
    monkeypatch.setattr(FeedCheck, "problem", lambda self, feeds, **kw: (calls.append(1), real(self, feeds, **kw))[1])
    runner.feed_check._passed.clear()
    for batch in (1, 1, 3, 7):
        assert runner.run({"x": np.ones((batch, 4), np.float32)})["probs"].shape == (batch, 3)
    assert len(calls) == 1
    for _ in range(2):  # a refused signature is not remembered
        with pytest.raises(InputError, match="expects float32; the value given is int64"):
            runner.run({"x": np.ones((1, 4), np.int64)})
    assert len(calls) == 3
    calls.clear()
    for batch in (1, 5):
        assert runner.run_unchecked({"x": np.ones((batch, 4), np.float32)})["probs"].shape == (batch, 3)
    assert calls == []
    with pytest.raises(InputError, match="expects float32; the value given is int64"):
        runner.run_unchecked({"x": np.ones((1, 4), np.int64)})
    assert len(calls) == 1


def test_a_fixed_axis_the_runtime_refuses_is_worded_by_the_check(runner):
    with pytest.raises(InputError) as err:
        runner.run({"x": np.ones((1, 5), np.float32)})
    assert err.value.message == "Input 'x' axis 1 must be 4 [batch, 4]; the value given has shape [1, 5]."
    assert "Got invalid dimensions" in str(err.value.__cause__)  # the runtime refused first


def test_a_bound_run_is_checked_when_bound_not_when_updated(runner, monkeypatch):
    bound = runner.bind({"x": np.ones((2, 4), np.float32)})
    monkeypatch.setattr(FeedCheck, "problem", lambda *a, **k: pytest.fail("checked on the timed path"))
    monkeypatch.setattr(FeedCheck, "__call__", lambda *a, **k: pytest.fail("checked on the timed path"))
    bound.update({"x": np.zeros((2, 4), np.float32)})
    bound.run()
    assert bound.outputs()["probs"].shape == (2, 3)


def test_fixed_axes_are_checked_only_when_asked(mlp_path):
    check = FeedCheck(load_model(str(mlp_path)).inputs)
    feeds = {"x": np.ones((2, 5), np.float32)}
    assert check.problem(feeds) is None  # a runner leaves the axes to the runtime
    assert check.problem(feeds, axes=True) == FeedProblem("axis", "x", want=4, got=(2, 5), axis=1)
    assert check.error(check.problem(feeds, axes=True)).message == (
        "Input 'x' axis 1 must be 4 [batch, 4]; the value given has shape [2, 5].")


def test_string_and_sequence_inputs(tmp_path):
    """Strings may come as object or str arrays (the kinds numpy has for text); values without a dtype
    (sequences as lists, optionals as None) are checked by name only, their contents by the runtime."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"]), helper.make_node("SequenceLength", ["items"], ["n"])],
        "mixed",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"]),
         helper.make_tensor_sequence_value_info("items", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["N"]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "mixed.onnx"))
    check = FeedCheck(load_model(str(tmp_path / "mixed.onnx")).inputs)
    items = [np.ones(2, np.float32)] * 3
    for text in (np.array(["a", "b"], dtype=object), np.array(["a", "b"])):
        assert check.problem({"text": text, "items": items}) is None
    found = check.problem({"text": np.ones(2, np.float32), "items": items})
    assert found.kind == "dtype" and check.error(found).message == (
        "Input 'text' expects string; the value given is float32.")
    runner = compile_model(load_model(str(tmp_path / "mixed.onnx")).bind(batch=2), parse_target("cpu"))
    try:
        out = runner.run({"text": np.array(["a", "b"], dtype=object), "items": items})
        assert list(out["same"]) == ["a", "b"] and int(out["n"]) == 3
    finally:
        runner.close()
