"""bench --instances/--concurrency through the RunnerPool: each instance bound and warmed in the thread that
times it, separate instances warming one at a time under the process's capture gate, nothing wrapped around
the timed call, and failures re-raised without leaving threads behind."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from onnxaccel.bench.concurrency import measure_concurrent
from onnxaccel.engines.pool import CAPTURE_GATE, RunnerPool
from onnxaccel.errors import InputError
from onnxaccel.pipeline import compile_only
from onnxaccel.target import parse_target

FEEDS = {"x": np.ones((2, 4), np.float32)}


@pytest.fixture()
def compiled(mlp_path):
    made = compile_only(str(mlp_path), parse_target("cpu?intra_op_num_threads=1"), batch=2)
    yield made
    made.close()


def _spy(runner, log: list):
    """Record, per call of ``runner``'s bound run, the thread and whether the capture gate was held exclusively."""
    real_bind = runner.bind

    def bind(feeds, **kw):
        log.append(("bind", threading.current_thread().name, CAPTURE_GATE._writing))
        bound = real_bind(feeds, **kw)
        real_run = bound.run

        def run():
            log.append(("run", threading.current_thread().name, CAPTURE_GATE._writing))
            return real_run()

        bound.run = run
        return bound

    runner.bind = bind


def test_each_instance_is_bound_warmed_and_timed_in_its_own_pool_thread(compiled):
    runners = [compiled.runner, compiled.new_runner(), compiled.new_runner()]
    logs = [[], [], []]
    for runner, log in zip(runners, logs):
        _spy(runner, log)
    try:
        timing = measure_concurrent(runners, FEEDS, concurrency=3, batch=2, warmup=2, runs=4)
    finally:
        for runner in runners[1:]:
            runner.close()
    assert timing.latency.count == 12 and set(timing.outputs()) == {"probs"}
    for index, log in enumerate(logs):
        assert {name for _, name, _ in log} == {f"run-bench-{index}_0"}  # bind, warm-up and timed calls
        assert [kind for kind, *_ in log] == ["bind"] + ["run"] * 6
        warm, timed = log[1:3], log[3:]
        assert all(exclusive for *_, exclusive in warm)  # one instance at a time, under the capture gate
        assert not any(exclusive for *_, exclusive in timed)


def test_threads_sharing_one_session_warm_up_side_by_side_without_the_gate(compiled):
    log = []
    _spy(compiled.runner, log)
    timing = measure_concurrent(compiled.runner, FEEDS, concurrency=2, batch=2, warmup=2, runs=3)
    assert timing.latency.count == 6
    assert not any(exclusive for *_, exclusive in log)
    assert {name for _, name, _ in log} == {"run-bench-0_0", "run-bench-1_0"}
    assert sum(kind == "bind" for kind, *_ in log) == 2  # a binding per thread


def test_a_pool_given_is_used_and_left_open(compiled):
    pool = RunnerPool([compiled.runner], owns=False, name="mine")
    try:
        timing = measure_concurrent(pool, FEEDS, concurrency=1, batch=2, warmup=1, runs=3, iobinding=False)
        assert timing.latency.count == 3 and set(timing.outputs()) == {"probs"}
        assert pool.submit(0, lambda: threading.current_thread().name).result() == "run-mine-0_0"  # still open
    finally:
        pool.close()


def test_a_failing_instance_is_reported_and_no_thread_is_left_behind(compiled):
    before = threading.active_count()
    with pytest.raises(InputError, match="expects float32"):
        measure_concurrent([compiled.runner, compiled.runner], {"x": np.ones((2, 4), np.float64)}, concurrency=2,
                           warmup=1, runs=2)
    assert threading.active_count() == before
