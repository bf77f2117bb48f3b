"""``queue_delay: fill``: with several instances on one device, a batch that is not full waits while another
instance's batch runs, until it is full or no batch runs, as long as enough requests are about (running, queued,
on their way: twice max batch) for a full batch to form beside it; ``adaptive`` starts it at once beside the
running one, and so does ``fill`` under less load. Real ONNX Runtime CPU sessions (two instances of the mlp); the
first batch's run is held on a gate, so "while another batch runs" lasts as long as the test says. The rows each
batch ran are the batcher's own record; requests "on their way" are the front end's own counter
(DynamicBatcher.expect)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import numpy as np
import onnxruntime as ort
import pytest

from onnxaccel.model import load_model
from onnxaccel.pipeline import compile_only
from onnxaccel.serve.batcher import DynamicBatcher
from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.instance import ModelInstance
from onnxaccel.target import parse_target


@pytest.fixture()
def compiled(mlp_path):
    made = compile_only(str(mlp_path), parse_target("cpu"), batch=1)
    yield made
    made.close()


def _gated(mlp_path, compiled, policy, delay_ms: float = 2):
    """Two mlp instances, max batch 8; the first run of all waits for ``gate``."""
    gate, started = threading.Event(), threading.Event()
    first = []

    def make():
        runner = compiled.new_runner()
        real = runner.run_unchecked

        def run(feeds):
            if not first:
                first.append(True)
                started.set()
                assert gate.wait(30), "the test never opened the gate"
            return real(feeds)

        runner.run_unchecked = run
        return runner

    config = ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=8, max_queue_delay_ms=delay_ms,
                         instances=2, queue_delay=policy)
    plan = dataclasses.replace(config.plan(load_model(str(mlp_path))), instances_at_load=2)
    return ModelInstance.start(config, compiled.model, plan, make), gate, started


async def _scenario(instance, gate, started, xs, *, fill_up: bool, first_rows: int = 8, on_the_way: int = 5,
                    fail_on_the_way: bool = False):
    """A request of ``first_rows`` rows runs (held at the gate); three 1-row requests are queued while it runs,
    with ``on_the_way`` more announced (their bodies "being read"); with ``fail_on_the_way`` those fail 0.1 s
    later without being queued; with ``fill_up``, five more arrive and fill a batch of eight. Returns the rows of
    each batch in the order they ran, and the outputs."""
    rows: list[int] = []
    batcher = DynamicBatcher(instance, on_batch=lambda n, seconds, phases: rows.append(n), sees_arrivals=True)
    loop = asyncio.get_running_loop()
    coming = [batcher.expect() for _ in range(on_the_way)]
    try:
        futures = [batcher.enqueue({"x": xs[0:first_rows]}, first_rows)]
        assert await loop.run_in_executor(None, started.wait, 30)
        futures += [batcher.enqueue({"x": xs[i:i + 1]}, 1) for i in range(first_rows, first_rows + 3)]
        if fail_on_the_way:
            await asyncio.sleep(0.1)
            for way in coming:  # never queued; the last release wakes the gathering batch
                way.release()
        await asyncio.sleep(0.3)  # the second instance has had its chance to take the three
        held = [rows[:], sum(f.done() for f in futures[1:])]
        if fill_up:
            futures += [batcher.enqueue({"x": xs[i:i + 1]}, 1) for i in range(first_rows + 3, first_rows + 8)]
            for way in coming:  # queued now: no longer on their way
                way.release()
            for _ in range(300):
                if rows:
                    break
                await asyncio.sleep(0.01)
            held.append(rows[:])  # before the gate opens: what ran beside the held batch
        gate.set()
        outputs = await asyncio.wait_for(asyncio.gather(*futures), 30)
        return held, rows, [out["probs"] for out, _ in outputs]
    finally:
        for way in coming:
            way.release()
        gate.set()
        await batcher.close()


def _outputs_match(mlp_path, xs, outputs) -> None:
    want = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"]).run(None, {"x": xs})[0]
    np.testing.assert_array_equal(np.concatenate(outputs), want[:sum(len(out) for out in outputs)])


@pytest.mark.parametrize("policy", ["fill", "adaptive"])
def test_a_batch_beside_a_running_one_waits_to_fill_only_with_fill(mlp_path, compiled, policy):
    """8 rows running, 3 queued, 5 on their way: 16, twice max batch. fill holds the three until eight are queued."""
    xs = np.random.default_rng(3).random((16, 4), dtype=np.float32)
    instance, gate, started = _gated(mlp_path, compiled, policy)
    try:
        held, rows, outputs = asyncio.run(_scenario(instance, gate, started, xs, fill_up=True))
    finally:
        instance.close()
    if policy == "fill":
        assert held[:2] == [[], 0]  # the three waited while the first batch ran
        assert held[2] == [8]  # and ran once eight rows were queued, beside the held one
        assert rows == [8, 8]
    else:  # adaptive waits for those on their way only max_queue_delay_ms (2 ms), then runs the three
        assert held[:2] == [[3], 3]
        assert sorted(rows) == [3, 5, 8]
    _outputs_match(mlp_path, xs, outputs)


def test_a_held_batch_runs_when_the_running_one_is_done(mlp_path, compiled):
    xs = np.random.default_rng(4).random((11, 4), dtype=np.float32)
    instance, gate, started = _gated(mlp_path, compiled, "fill")
    try:
        held, rows, outputs = asyncio.run(_scenario(instance, gate, started, xs, fill_up=False))
    finally:
        instance.close()
    assert held == [[], 0]
    assert rows == [8, 3]  # not full, so it ran once the device had no batch running
    _outputs_match(mlp_path, xs, outputs)


def test_fill_under_less_load_gathers_as_adaptive(mlp_path, compiled):
    """8 rows running and 3 queued, none on their way: 11 < 16, so a full batch cannot form beside the running
    one. Holding would only wait for it to end (one batch at a time, the device idle between them); fill runs the
    three at once, as adaptive does."""
    xs = np.random.default_rng(5).random((11, 4), dtype=np.float32)
    instance, gate, started = _gated(mlp_path, compiled, "fill")
    try:
        held, rows, outputs = asyncio.run(_scenario(instance, gate, started, xs, fill_up=False, on_the_way=0))
    finally:
        instance.close()
    assert held == [[3], 3]
    assert rows == [3, 8]
    _outputs_match(mlp_path, xs, outputs)


def test_fill_judges_the_load_by_its_recent_peak_not_the_moment(mlp_path, compiled):
    """16 requests about (8 rows running, 3 queued, 5 on their way), then the 5 fail before they are queued: the
    count of the moment is 11, but 16 were about within FILL_WINDOW_S, so the three still wait for the running
    batch (when a batch ends, its clients are on their way back and out of every count)."""
    xs = np.random.default_rng(6).random((11, 4), dtype=np.float32)
    instance, gate, started = _gated(mlp_path, compiled, "fill")
    try:
        held, rows, outputs = asyncio.run(_scenario(instance, gate, started, xs, fill_up=False,
                                                    fail_on_the_way=True))
    finally:
        instance.close()
    assert held == [[], 0], "the three ran at once: fill judged the load by the dip of the moment"
    assert rows == [8, 3]
    _outputs_match(mlp_path, xs, outputs)


@pytest.mark.parametrize("policy", ["fill", "adaptive"])
def test_a_batch_end_does_not_cut_short_a_batch_gathering_as_adaptive(mlp_path, compiled, policy):
    """The model process of --shared-models counts requests on their way by its workers' counters, which drop
    when a request is written to the link, before it is queued here. Under less load fill gathers as adaptive
    does, waiting for arrivals: another batch's end must not wake it in that gap, or it leaves without the
    request already on the link (smaller batches than adaptive's)."""
    xs = np.random.default_rng(7).random((10, 4), dtype=np.float32)
    instance, gate, started = _gated(mlp_path, compiled, policy, delay_ms=2000)
    counted = [0]

    async def scenario():
        rows: list[int] = []
        batcher = DynamicBatcher(instance, on_batch=lambda n, seconds, phases: rows.append(n),
                                 arrivals=lambda name: counted[0])
        loop = asyncio.get_running_loop()
        try:
            futures = [batcher.enqueue({"x": xs[0:8]}, 8)]
            assert await loop.run_in_executor(None, started.wait, 30)
            counted[0] = 1  # a worker is reading a body
            futures.append(batcher.enqueue({"x": xs[8:9]}, 1))
            await asyncio.sleep(0.1)  # 8 + 1 + 1 about: under twice max batch, so it gathers as adaptive does
            counted[0] = 0  # the worker wrote it to the link
            gate.set()  # the running batch ends while the request is in the link
            await asyncio.sleep(0.2)
            futures.append(batcher.enqueue({"x": xs[9:10]}, 1))  # read from the link, queued
            outputs = await asyncio.wait_for(asyncio.gather(*futures), 30)
            return rows, [out["probs"] for out, _ in outputs]
        finally:
            gate.set()
            await batcher.close()

    try:
        rows, outputs = asyncio.run(scenario())
    finally:
        instance.close()
    assert rows == [8, 2], f"{policy}: the batch left before the request on the link was queued"
    _outputs_match(mlp_path, xs, outputs)


def test_fill_is_a_known_queue_delay(mlp_path):
    assert ModelConfig(name="m", source=str(mlp_path), queue_delay="fill").queue_delay == "fill"
