"""BucketedRunner follows the Runner template (engines/base.py, docs/ARCHITECTURE.md "Runners and feeds"): ``run``
and ``bind`` check the feeds once, with the one feed checker, before the bucket's session runs them (unchecked: the
bucket's session does not check the padded feeds again); ``run_unchecked`` checks nothing; a bad feed gets the
plain runner's error. Real ONNX Runtime CPU sessions of zoo:bert-tiny, buckets on its ``sequence`` dim."""

from __future__ import annotations

import numpy as np
import pytest

from onnxaccel.engines import compile_model
from onnxaccel.engines.buckets import BucketedRunner, ShapeBuckets
from onnxaccel.errors import InputError
from onnxaccel.feeds_check import FeedCheck
from onnxaccel.model import load_model
from onnxaccel.target import parse_target

CPU = parse_target("cpu")


@pytest.fixture(scope="module")
def bert():
    return load_model("zoo:bert-tiny")


@pytest.fixture(scope="module", params=[False, True], ids=["one-session", "per-bucket"])
def bucketed(request, bert):
    with BucketedRunner(bert, CPU, ShapeBuckets.parse("sequence=16,32"), per_bucket=request.param) as runner:
        yield runner


@pytest.fixture(scope="module")
def plain(bert):
    with compile_model(bert.bind({"sequence": (20,)}, batch=1), CPU) as runner:
        yield runner


@pytest.fixture
def checks(monkeypatch):
    """Every call of a runner's feed check (FeedCheck.__call__), on any runner, counted."""
    calls = []
    original = FeedCheck.__call__

    def counted(self, feeds):
        calls.append(self)
        return original(self, feeds)

    monkeypatch.setattr(FeedCheck, "__call__", counted)
    return calls


def _tokens(length: int = 20) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(length).integers(1, 1000, (1, length)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def _bad(kind: str) -> dict[str, np.ndarray]:
    feeds = _tokens()
    if kind == "dtype":
        feeds["input_ids"] = feeds["input_ids"].astype(np.float32)
    elif kind == "missing":
        del feeds["token_type_ids"]
    elif kind == "unknown":
        feeds["labels"] = np.zeros((1,), np.int64)
    elif kind == "rank":
        feeds["attention_mask"] = feeds["attention_mask"][0]
    return feeds


def test_bucketed_runner_implements_the_template_not_run():
    assert "_run" in BucketedRunner.__dict__ and "_bind" in BucketedRunner.__dict__
    assert "run" not in BucketedRunner.__dict__ and "bind" not in BucketedRunner.__dict__


def test_run_checks_the_feeds_once(bucketed, checks):
    out = bucketed.run(_tokens())
    assert out["last_hidden_state"].shape == (1, 20, 128)  # padded to 32, cropped back
    assert checks == [bucketed.feed_check]  # not again by the bucket's session on the padded feeds


def test_bind_checks_the_feeds_once(bucketed, checks):
    bound = bucketed.bind(_tokens())
    bound.run()
    assert bound.outputs()["last_hidden_state"].shape == (1, 20, 128)
    assert checks == [bucketed.feed_check]


def test_run_unchecked_checks_nothing_and_equals_run(bucketed, checks):
    feeds = _tokens()
    out = bucketed.run_unchecked(feeds)
    assert checks == []
    np.testing.assert_allclose(out["last_hidden_state"], bucketed.run(feeds)["last_hidden_state"], atol=1e-6)


@pytest.mark.parametrize("kind", ["dtype", "missing", "unknown", "rank"])
def test_a_bad_feed_gets_the_plain_runners_error(bucketed, plain, checks, kind):
    with pytest.raises(InputError) as expected:
        plain.run(_bad(kind))
    checks.clear()
    for call in (bucketed.run, bucketed.bind):
        with pytest.raises(InputError) as got:
            call(_bad(kind))
        assert (got.value.message, got.value.hint) == (expected.value.message, expected.value.hint)
    assert checks == [bucketed.feed_check, bucketed.feed_check]  # once per call, nothing ran after it


@pytest.mark.parametrize("kind", ["dtype", "missing", "rank"])
def test_run_unchecked_still_words_a_refused_bad_feed_as_the_plain_runner(bucketed, plain, kind):
    with pytest.raises(InputError) as expected:
        plain.run_unchecked(_bad(kind))
    with pytest.raises(InputError) as got:
        bucketed.run_unchecked(_bad(kind))
    assert got.value.message == expected.value.message


def test_a_feed_that_fits_no_bucket_is_still_named_by_the_buckets(bucketed):
    for call in (bucketed.run, bucketed.run_unchecked, bucketed.bind):
        with pytest.raises(InputError) as caught:
            call(_tokens(40))
        assert "sequence=16,32" in caught.value.message
