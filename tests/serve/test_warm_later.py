"""A server warms the padded sizes left for after ready (plan warm_at_load) while its instances are idle: the
batcher's workers build and warm them in the instances' threads between batches, one instance staying free for
requests, and each size is used once warm on every instance. Real ONNX Runtime CPU sessions, with the padded
sizes set as a GPU target gets them (the plan gives them to GPU targets only)."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import onnxruntime as ort

from onnxaccel.engines.pool_warm import WarmLater
from onnxaccel.plan import PlanRequest, plan_execution
from onnxaccel.serve.batcher import DynamicBatcher
from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.repository import load_instance
from onnxaccel.target import parse_target


def test_idle_instances_warm_the_later_sizes_and_requests_are_answered_meanwhile(mlp_path):
    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=8,
                                         max_queue_delay_ms=0, instances=2))
    pool = instance.pool
    pool.buckets = (8,)
    pool.later = WarmLater([1, 2, 4], 2, None)
    warming: list[tuple[str, int, float, float]] = []
    real = pool._warm

    def spy(index, size):
        start = time.perf_counter()
        time.sleep(0.05)
        real(index, size)
        warming.append((threading.current_thread().name, index, start, time.perf_counter()))

    pool._warm = spy
    x = np.random.default_rng(3).random((1, 4), dtype=np.float32)
    want = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    async def scenario():
        batcher = DynamicBatcher(instance)
        try:
            first, _ = await batcher.submit({"x": x}, 1)  # answered while the sizes warm
            for _ in range(200):
                if not pool.later.sizes:
                    break
                await asyncio.sleep(0.02)
            last, _ = await batcher.submit({"x": x}, 1)
            return first, last
        finally:
            await batcher.close()

    try:
        first, last = asyncio.run(scenario())
    finally:
        instance.close()
    np.testing.assert_array_equal(first["probs"], want)
    np.testing.assert_array_equal(last["probs"], want)
    assert pool.buckets == (1, 2, 4, 8)
    assert sorted((i, n.rsplit("_", 1)[0]) for n, i, *_ in warming) == [(0, "run-mlp-0")] * 3 + [(1, "run-mlp-1")] * 3
    spans = sorted((start, end) for *_, start, end in warming)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))  # one at a time (of 2)


def test_the_plan_warms_the_largest_size_at_load_unless_told_otherwise():
    target = parse_target("cuda:0", precision="fp16")
    plan = plan_execution(target, PlanRequest(command="serve", max_batch=64))
    assert plan.batch_sizes == (1, 2, 4, 8, 16, 32, 64) and plan.warm_at_load == (64,)
    assert "in the background" in plan.choice("warm_at_load").reason
    everything = plan_execution(target, PlanRequest(command="serve", max_batch=64, warm_all_sizes=True))
    assert everything.warm_at_load == everything.batch_sizes
    buckets = plan_execution(target, PlanRequest(command="serve", max_batch=64, shape_buckets="sequence=32,64"))
    assert buckets.warm_at_load == buckets.batch_sizes
    assert plan_execution(target, PlanRequest(command="batch", batch=64)).warm_at_load == (64,)
    assert ModelConfig(name="m", source="m.onnx", target=target, max_batch=64).plan().warm_at_load == (64,)
    assert ModelConfig(name="m", source="m.onnx", target=target, max_batch=64,
                       warm_all_sizes=True).plan().warm_at_load == plan.batch_sizes


def test_log_level_info_puts_onnxaccel_messages_on_stderr_once(capfd):
    import logging

    from onnxaccel.serve.processes import log_level

    logger = logging.getLogger("onnxaccel")
    before = (logger.level, list(logger.handlers))
    try:
        log_level("warning")
        assert logger.handlers == before[1]  # warnings print anyway (Python's last-resort handler)
        log_level("info")
        log_level("info")
        assert len(logger.handlers) == len(before[1]) + 1
        logging.getLogger("onnxaccel.engines.pool").info("'m': batch size 1 warm on every instance, in use")
        assert "INFO onnxaccel.engines.pool: 'm': batch size 1 warm" in capfd.readouterr().err
    finally:
        logger.setLevel(before[0])
        logger.handlers[:] = before[1]


def test_a_warm_step_that_raises_stops_warming_and_the_instance_serves_on(mlp_path, caplog):
    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=8,
                                         max_queue_delay_ms=0, instances=1))
    pool = instance.pool
    pool.buckets = (8,)
    pool.later = WarmLater([1, 2], 1, None)

    def broken(index):
        raise RuntimeError("unexpected")

    pool.warm_step = broken
    x = np.ones((1, 4), dtype=np.float32)

    async def scenario():
        batcher = DynamicBatcher(instance)
        try:
            for _ in range(100):
                if pool.later is None:
                    break
                await asyncio.sleep(0.01)
            outputs, _ = await asyncio.wait_for(batcher.submit({"x": x}, 1), 10)
            return outputs
        finally:
            await batcher.close()

    try:
        outputs = asyncio.run(scenario())
    finally:
        instance.close()
    assert outputs["probs"].shape == (1, 3) and pool.later is None
    assert "warming padded sizes after ready stopped" in caplog.text
