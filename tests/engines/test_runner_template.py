"""The Runner template (engines/base.py): ``run`` and ``bind`` check the feeds once with the one feed checker
(feeds_check.FeedCheck) and then call the engine's ``_run``/``_bind``; an engine gets the check without writing
it, and ``run_unchecked`` (callers that checked already) adds nothing but still words a refused run."""

from __future__ import annotations

import numpy as np
import pytest

from onnxaccel.engines import compile_model
from onnxaccel.engines.base import HostBoundRun, Runner
from onnxaccel.errors import InferenceError, InputError
from onnxaccel.feeds_check import FeedCheck
from onnxaccel.model import load_model
from onnxaccel.target import parse_target


class EchoRunner(Runner):
    """A minimal engine: only ``_run`` (and the providers it reports)."""

    def __init__(self, model):
        self.model = model
        self.ran: list[dict] = []

    @property
    def providers(self) -> list[str]:
        return ["Echo"]

    def _run(self, feeds):
        self.ran.append(dict(feeds))
        if feeds["x"].shape[1] != 4:  # what a runtime that checks fixed axes itself would refuse
            raise InferenceError("the runtime refused the feeds")
        return {"probs": np.zeros((feeds["x"].shape[0], 3), np.float32)}


@pytest.fixture
def echo(mlp_path):
    return EchoRunner(load_model(str(mlp_path)))


@pytest.mark.parametrize("feeds,message", [
    ({"x": np.ones((1, 4), np.float64)}, "Input 'x' expects float32; the value given is float64."),
    ({"x": np.ones(4, np.float32)}, "Input 'x' expects rank 2 [batch, 4]; the value given has shape [4]."),
    ({"x": np.ones((1, 4), np.float32), "y": np.ones(1)}, "Unknown input name(s): y."),
    ({}, "No value for input(s): x."),
])
def test_a_runner_implementing_only_run_gets_the_feed_check(echo, feeds, message):
    for call in (echo.run, echo.bind):
        with pytest.raises(InputError) as err:
            call(feeds)
        assert err.value.message == message
    assert echo.ran == []  # _run never saw them


def test_feeds_that_fit_reach_run_once_and_bind_defaults_to_a_host_run(echo):
    x = np.ones((2, 4), np.float32)
    assert echo.run({"x": x})["probs"].shape == (2, 3) and len(echo.ran) == 1
    bound = echo.bind({"x": x})
    assert isinstance(bound, HostBoundRun) and len(echo.ran) == 1
    bound.update({"x": np.zeros((3, 4), np.float32)})
    bound.run()
    assert bound.outputs()["probs"].shape == (3, 3) and len(echo.ran) == 2


def test_run_unchecked_skips_the_check_and_words_a_refused_run(echo, monkeypatch):
    monkeypatch.setattr(FeedCheck, "__call__", lambda *a, **k: pytest.fail("checked"))
    assert echo.run_unchecked({"x": np.ones((1, 4), np.float32)})["probs"].shape == (1, 3)
    with pytest.raises(InputError) as err:  # fixed axes: left to the runtime, its refusal worded by the check
        echo.run_unchecked({"x": np.ones((1, 5), np.float32)})
    assert err.value.message == "Input 'x' axis 1 must be 4 [batch, 4]; the value given has shape [1, 5]."
    assert isinstance(err.value.__cause__, InferenceError)


def test_a_refusal_the_check_cannot_explain_stays_the_engines_error(echo):
    echo._run = lambda feeds: (_ for _ in ()).throw(InferenceError("out of memory"))
    with pytest.raises(InferenceError, match="out of memory"):
        echo.run({"x": np.ones((1, 4), np.float32)})


def test_a_runner_that_replaces_run_whole_needs_no_run_hook(mlp_path):
    class Whole(Runner):
        def __init__(self, model):
            self.model = model

        providers = ["Whole"]

        def run(self, feeds):
            return {"whole": True}

    runner = Whole(load_model(str(mlp_path)))  # not abstract: its _run is its run
    assert runner.run_unchecked({}) == {"whole": True}
    assert runner.bind({"x": np.ones((1, 4), np.float32)}).outputs() == {"whole": True}


def test_a_runner_without_run_cannot_be_made(mlp_path):
    class Nothing(Runner):
        providers = ["None"]

    with pytest.raises(TypeError, match="_run"):
        Nothing()


def _count_checks(monkeypatch) -> list:
    calls = []
    real = FeedCheck.__call__
    monkeypatch.setattr(FeedCheck, "__call__", lambda self, feeds: (calls.append(1), real(self, feeds))[1])
    for name in ("validate_feeds", "check_tensor"):
        monkeypatch.setattr(f"onnxaccel.feeds_check.{name}", lambda *a, **k: pytest.fail(f"{name} called"))
    return calls


def test_the_ort_runner_checks_once_per_run_and_once_per_bind(mlp_path, monkeypatch):
    runner = compile_model(load_model(str(mlp_path)).bind(batch=2), parse_target("cpu"))
    try:
        calls = _count_checks(monkeypatch)
        x = {"x": np.ones((2, 4), np.float32)}
        for n in range(1, 4):
            runner.run(x)
            assert len(calls) == n
        bound = runner.bind(x)
        bound.update(x)
        bound.run()
        assert len(calls) == 4
    finally:
        runner.close()
