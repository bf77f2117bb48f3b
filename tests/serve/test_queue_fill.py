"""``queue_delay: fill``: with several instances on one device, a batch that is not full waits while another
instance's batch runs, until it is full or no batch runs; ``adaptive`` starts it at once beside the running one.
Real ONNX Runtime CPU sessions (two instances of the mlp); the first batch's run is held on a gate, so "while
another batch runs" lasts as long as the test says. The rows each batch ran are the batcher's own record."""

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


def _gated(mlp_path, compiled, policy):
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

    config = ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=8, max_queue_delay_ms=2,
                         instances=2, queue_delay=policy)
    plan = dataclasses.replace(config.plan(load_model(str(mlp_path))), instances_at_load=2)
    return ModelInstance.start(config, compiled.model, plan, make), gate, started


async def _scenario(instance, gate, started, xs, *, fill_up: bool):
    """One request runs (held at the gate); three more are queued while it runs, then, with ``fill_up``, five
    more that fill a batch of eight. Returns the rows of each batch in the order they ran, and the outputs."""
    rows: list[int] = []
    batcher = DynamicBatcher(instance, on_batch=lambda n, seconds, phases: rows.append(n), sees_arrivals=True)
    loop = asyncio.get_running_loop()
    try:
        futures = [batcher.enqueue({"x": xs[0:1]}, 1)]
        assert await loop.run_in_executor(None, started.wait, 30)
        futures += [batcher.enqueue({"x": xs[i:i + 1]}, 1) for i in range(1, 4)]
        await asyncio.sleep(0.3)  # the second instance has had its chance to take the three
        held = [rows[:], sum(f.done() for f in futures[1:])]
        if fill_up:
            futures += [batcher.enqueue({"x": xs[i:i + 1]}, 1) for i in range(4, 9)]
            for _ in range(300):
                if rows:
                    break
                await asyncio.sleep(0.01)
            held.append(rows[:])  # before the gate opens: what ran beside the held batch
        gate.set()
        outputs = await asyncio.wait_for(asyncio.gather(*futures), 30)
        return held, rows, [out["probs"] for out, _ in outputs]
    finally:
        gate.set()
        await batcher.close()


@pytest.mark.parametrize("policy", ["fill", "adaptive"])
def test_a_batch_beside_a_running_one_waits_to_fill_only_with_fill(mlp_path, compiled, policy):
    xs = np.random.default_rng(3).random((9, 4), dtype=np.float32)
    want = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"]).run(None, {"x": xs})[0]
    instance, gate, started = _gated(mlp_path, compiled, policy)
    try:
        held, rows, outputs = asyncio.run(_scenario(instance, gate, started, xs, fill_up=True))
    finally:
        instance.close()
    if policy == "fill":
        assert held[:2] == [[], 0]  # the three waited while the first batch ran
        assert held[2] == [8]  # and ran once eight rows were queued, beside the held one
        assert rows == [8, 1]
    else:
        assert held[:2] == [[3], 3]  # adaptive: the three ran at once on the free instance
        assert sorted(rows) == [1, 3, 5]
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out, want[i:i + 1])


def test_a_held_batch_runs_when_the_running_one_is_done(mlp_path, compiled):
    xs = np.random.default_rng(4).random((4, 4), dtype=np.float32)
    instance, gate, started = _gated(mlp_path, compiled, "fill")
    try:
        held, rows, outputs = asyncio.run(_scenario(instance, gate, started, xs, fill_up=False))
    finally:
        instance.close()
    assert held == [[], 0]
    assert rows == [1, 3]  # not full, so it ran once the device had no batch running
    want = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"]).run(None, {"x": xs})[0]
    for i, out in enumerate(outputs):
        np.testing.assert_array_equal(out, want[i:i + 1])


def test_fill_is_a_known_queue_delay(mlp_path):
    assert ModelConfig(name="m", source=str(mlp_path), queue_delay="fill").queue_delay == "fill"
