"""Building and warming a RunnerPool (engines/pool_warm.py) on real ONNX Runtime CPU sessions: the first instance
made alone and the others side by side, first runs side by side (alone where they capture a graph), and padded
sizes left for later that join the pool once warm on every instance."""

from __future__ import annotations

import threading
import time

import numpy as np

from onnxaccel.engines.pool import CaptureGate, RunnerPool
from onnxaccel.engines.pool_warm import WarmLater


def test_the_first_instance_is_made_alone_and_the_others_side_by_side(compiled):
    spans: dict[str, list[tuple[float, float]]] = {}
    lock = threading.Lock()

    def make():
        start = time.perf_counter()
        time.sleep(0.3)
        with lock:
            spans.setdefault(threading.current_thread().name, []).append((start, time.perf_counter()))
        return compiled.new_runner()

    pool = RunnerPool.build(make, 3, name="side")
    try:
        first = spans.pop("run-side-0_0")[0]
        others = [found[0] for found in spans.values()]
        assert len(others) == 2
        assert all(start >= first[1] for start, _ in others)  # after the first one (its caches are written)
        assert max(s for s, _ in others) < min(e for _, e in others)  # and with each other
    finally:
        pool.close()


class Recorded:
    """A bound run that records the capture gate's state at each run."""

    def __init__(self, bound, gate, seen):
        self.bound, self.gate, self.seen = bound, gate, seen

    def run(self):
        self.seen.append((self.gate._writing, self.gate._readers))
        return self.bound.run()

    def __getattr__(self, name):
        return getattr(self.bound, name)


def test_graph_warm_ups_hold_the_gate_alone_from_the_first_run_on(compiled, reference):
    """ONNX Runtime captures during a session's first Run already (it runs again at once until captured, in CUDA's
    global capture mode: on the H100 a first run beside another instance's failed with CUDA error 900/901)."""
    gate, seen = CaptureGate(), []
    runners = [compiled.new_runner(), compiled.new_runner()]
    for runner in runners:
        real = runner.bind
        runner.bind = lambda feeds, _real=real, **kw: Recorded(_real(feeds, **kw), gate, seen)
    pool = RunnerPool(runners, model=compiled.model, buckets=(2,), graph=True, gate=gate, name="graphs")
    try:
        assert pool.warm_up() == [2]
        assert seen == [(True, 0)] * 2 * 3  # every run of both warm-ups, the first included, alone
        x = np.random.default_rng(0).random((2, 4), dtype=np.float32)
        outputs, _ = pool.submit(1, pool.run_rows, 1, [{"x": x}]).result()
        np.testing.assert_array_equal(outputs["probs"], reference(x))
    finally:
        pool.close()


def test_warm_ups_without_graphs_go_side_by_side_holding_the_gate_shared(compiled):
    gate, states, spans = CaptureGate(), [], []
    pool = RunnerPool([compiled.new_runner(), compiled.new_runner()], buckets=(2,), gate=gate, name="plain")
    real = pool._execute

    def slow(index, feeds, **how):
        states.append((gate._writing, gate._readers))
        start = time.perf_counter()
        time.sleep(0.2)
        spans.append((start, time.perf_counter()))
        return real(index, feeds, **how)

    pool._execute = slow
    try:
        assert pool.warm_up() == [2]
        assert all(not writing and readers >= 1 for writing, readers in states)
        assert max(s for s, _ in spans) < min(e for _, e in spans)  # the two first runs overlapped
    finally:
        pool.close()


def test_sizes_left_for_later_join_once_warm_on_every_instance(compiled, reference):
    made = []

    def make():
        made.append(threading.current_thread().name)
        return compiled.new_runner()

    pool = RunnerPool.build(make, 2, buckets=(1, 2, 4), session_per_bucket=True, warm_now=(4,), name="later")
    try:
        assert len(made) == 2 and pool.warm_up() == [4]
        assert pool.buckets == (4,) and pool.bucket(1) == 4  # until the others are warm, batches pad to 4
        assert pool.later.to_dict() == {"pending": [1, 2], "failed": {}}
        x = np.random.default_rng(1).random((1, 4), dtype=np.float32)
        outputs, _ = pool.submit(0, pool.run_rows, 0, [{"x": x}]).result()
        np.testing.assert_array_equal(outputs["probs"], reference(x))

        assert pool.submit(0, pool.warm_step, 0).result()
        assert pool.buckets == (4,)  # size 1 is warm on instance 0 only: not used yet
        assert pool.submit(1, pool.warm_step, 1).result()
        assert pool.buckets == (1, 4) and pool.bucket(1) == 1
        while pool.submit(0, pool.warm_step, 0).result() | pool.submit(1, pool.warm_step, 1).result():
            pass
        assert pool.buckets == (1, 2, 4) and pool.later.to_dict()["pending"] == []
        assert [sorted(s) for s in pool.sessions] == [[1, 2, 4], [1, 2, 4]]
        assert sorted(made) == ["run-later-0_0"] * 3 + ["run-later-1_0"] * 3  # each in its instance's thread
        outputs, _ = pool.submit(1, pool.run_rows, 1, [{"x": x}]).result()
        np.testing.assert_array_equal(outputs["probs"], reference(x))
    finally:
        pool.close()
    assert all(r.session is None for s in pool.sessions for r in s.values())  # later sessions are closed too


def test_a_size_that_fails_later_is_dropped_and_larger_ones_still_serve(compiled, reference, caplog):
    calls = []

    def make():
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("out of device memory")
        return compiled.new_runner()

    pool = RunnerPool.build(make, 1, buckets=(2, 4), session_per_bucket=True, warm_now=(4,), name="fails")
    try:
        pool.warm_up()
        assert pool.submit(0, pool.warm_step, 0).result()
        assert pool.buckets == (4,) and pool.later.to_dict() == {"pending": [],
                                                                 "failed": {"2": "out of device memory"}}
        assert "batch size 2 could not be warmed" in caplog.text
        assert not pool.submit(0, pool.warm_step, 0).result()
        x = np.random.default_rng(2).random((2, 4), dtype=np.float32)
        outputs, _ = pool.submit(0, pool.run_rows, 0, [{"x": x}]).result()
        np.testing.assert_array_equal(outputs["probs"], reference(x))
    finally:
        pool.close()


def test_one_instance_stays_free_while_others_warm():
    later = WarmLater([1, 2], 3, None)
    assert later.next_for(0) == 1 and later.next_for(1) == 1
    assert later.next_for(2) is None  # two of three warming: the third serves
    assert not later.done(0, 1) and later.next_for(2) == 1
    assert later.next_for(0) is None  # 1 and 2 are warming: 0 serves
    assert not later.done(1, 1) and later.done(2, 1)  # size 1 warm on all three
    assert later.sizes == [2] and later.pending_for(0)
    alone = WarmLater([1], 1, None)
    assert alone.next_for(0) == 1  # a single instance may warm (nothing else could serve meanwhile either)


def test_a_size_dropped_on_one_instance_is_not_counted_on_another():
    later = WarmLater([1], 2, None)
    assert later.next_for(0) == 1
    later._busy.add(1)  # instance 1 warms size 1 at the same time
    assert not later.done(0, 1, "out of memory")
    assert not later.done(1, 1)  # it finished after size 1 was dropped: ignored, not a KeyError
    assert later.to_dict() == {"pending": [], "failed": {"1": "out of memory"}}
