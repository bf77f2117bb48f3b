"""A GPU server is ready once its first instance is warm; the others are built and warmed one at a time while it
serves, and each takes batches once warm (plan ``instances_at_load``, engines/pool_warm.py ``join_step``:
graph-captured instances warm one after the other, so building all of them before ready delayed it). Real ONNX
Runtime CPU sessions, with the plan's ``instances_at_load`` set as a GPU target gets it (the plan gives it to GPU
targets only)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import numpy as np
import onnxruntime as ort
import pytest

from onnxaccel.engines.pool import RunnerPool
from onnxaccel.model import load_model
from onnxaccel.plan import PlanRequest, plan_execution
from onnxaccel.serve.batcher import DynamicBatcher
from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.instance import ModelInstance
from onnxaccel.pipeline import compile_only
from onnxaccel.target import parse_target


@pytest.fixture()
def compiled(mlp_path):
    """The mlp bound at batch 1 and compiled for the CPU; ``new_runner()`` makes further sessions."""
    made = compile_only(str(mlp_path), parse_target("cpu"), batch=1)
    yield made
    made.close()


def _instance(mlp_path, compiled, count, make=None, buckets=()):
    """A served mlp with ``count`` instances of which only the first is built at load (as on a GPU)."""
    config = ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=8, max_queue_delay_ms=0,
                         instances=count)
    plan = dataclasses.replace(config.plan(load_model(str(mlp_path))), instances_at_load=1, batch_sizes=buckets,
                               warm_at_load=buckets)
    return ModelInstance.start(config, compiled.model, plan, make or compiled.new_runner)


def test_the_first_instance_serves_at_once_and_the_others_join_one_at_a_time(mlp_path, compiled):
    spans: list[tuple[str, float, float]] = []
    ran_on: list[str] = []

    def make():
        start = time.perf_counter()
        time.sleep(0.2)  # a GPU session's build and first run take seconds
        runner = compiled.new_runner()
        spans.append((threading.current_thread().name.rsplit("_", 1)[0], start, time.perf_counter()))
        real = runner.run_unchecked

        def spy(feeds):
            ran_on.append(threading.current_thread().name.rsplit("_", 1)[0])
            return real(feeds)

        runner.run_unchecked = spy
        return runner

    instance = _instance(mlp_path, compiled, 3, make)
    assert len(spans) == 1 and instance.pool.in_service == 1 and instance.planned == 3  # ready: one built
    assert not instance.serves(1) and instance.may_join(1)
    x = np.random.default_rng(5).random((1, 4), dtype=np.float32)
    want = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    async def scenario():
        batcher = DynamicBatcher(instance)
        try:
            first, _ = await batcher.submit({"x": x}, 1)  # answered while instances 1 and 2 join
            answered_with = instance.pool.in_service
            for _ in range(300):
                if instance.pool.in_service == 3:
                    break
                await asyncio.sleep(0.02)
            outs = await asyncio.gather(*(batcher.submit({"x": x}, 1) for _ in range(60)))
            return first, answered_with, outs
        finally:
            await batcher.close()

    try:
        first, answered_with, outs = asyncio.run(scenario())
        assert instance.pool.in_service == 3 and instance.pool.joining is None
    finally:
        instance.close()
    assert answered_with < 3  # the first request did not wait for every instance
    np.testing.assert_array_equal(first["probs"], want)
    for out, _ in outs:
        np.testing.assert_array_equal(out["probs"], want)
    assert [name for name, *_ in spans] == ["run-mlp-0", "run-mlp-1", "run-mlp-2"]  # each in its own thread
    assert all(a_end <= b_start for (_, _, a_end), (_, b_start, _) in zip(spans, spans[1:]))  # one at a time
    assert {"run-mlp-1", "run-mlp-2"} & set(ran_on)  # the joined instances take batches


def test_a_joining_instance_is_warmed_at_the_sizes_in_use_before_it_takes_work(mlp_path, compiled):
    instance = _instance(mlp_path, compiled, 2, buckets=(4,))
    pool = instance.pool
    warmed: list[tuple[int, int]] = []
    real = pool._warm
    pool._warm = lambda index, size: (warmed.append((index, size)), real(index, size))[1]
    try:
        assert pool.submit(1, pool.join_step, 1).result() is True
        assert warmed == [(1, 4)] and pool.serves(1) and pool.joining is None
        assert pool.joining is None and pool.submit(1, pool.join_step, 1).result() is False  # nothing left
        outputs, _ = pool.submit(1, pool.run_rows, 1, [{"x": np.ones((3, 4), np.float32)}]).result()
        assert outputs["probs"].shape == (3, 3)
    finally:
        instance.close()


def test_instances_join_in_order_only(mlp_path, compiled):
    instance = _instance(mlp_path, compiled, 3)
    try:
        assert instance.pool.submit(2, instance.join_step, 2).result() is False  # instance 1 first
        assert not instance.serves(2) and instance.may_join(2)
        assert instance.pool.submit(1, instance.join_step, 1).result() is True
        assert instance.pool.submit(2, instance.join_step, 2).result() is True
        assert [instance.serves(i) for i in range(3)] == [True, True, True]
    finally:
        instance.close()


def test_a_join_that_fails_stops_joining_and_the_others_serve_on(mlp_path, compiled, caplog):
    made = []

    def make():
        if len(made) == 2:  # instance 2
            raise RuntimeError("out of device memory")
        made.append(compiled.new_runner())
        return made[-1]

    instance = _instance(mlp_path, compiled, 4, make)
    x = np.ones((1, 4), dtype=np.float32)

    async def scenario():
        batcher = DynamicBatcher(instance)
        try:
            for _ in range(300):
                if instance.pool.joining.stopped:
                    break
                await asyncio.sleep(0.02)
            return await asyncio.wait_for(asyncio.gather(*(batcher.submit({"x": x}, 1) for _ in range(20))), 10)
        finally:
            await batcher.close()

    try:
        outs = asyncio.run(scenario())
        assert instance.pool.in_service == 2 and len(instance.pool.runners) == 2
        assert "instance 2 could not be built or warmed: out of device memory" in instance.pool.joining.stopped
        assert not instance.may_join(3)
    finally:
        instance.close()
    assert all(out["probs"].shape == (1, 3) for out, _ in outs)
    assert "2 of 4 instance(s) serve" in caplog.text


@pytest.mark.parametrize("ask, want", [({}, 1), ({"warm_all_sizes": True}, 4),
                                       ({"shape_buckets": "sequence=32,64"}, 4)])
def test_the_plan_builds_one_gpu_instance_before_ready_unless_told_otherwise(ask, want):
    target = parse_target("cuda:0", precision="fp16")
    plan = plan_execution(target, PlanRequest(command="serve", max_batch=64, instances=4, **ask))
    assert plan.instances == 4 and plan.instances_at_load == want
    assert plan.to_dict()["instances_at_load"] == want
    if want == 1:
        assert "the other 3 are built and warmed one at a time" in plan.choice("instances_at_load").reason


def test_cpu_servers_and_commands_but_batch_build_every_instance_at_load():
    assert plan_execution(parse_target("cpu"), PlanRequest(command="serve", instances=3)).instances_at_load == 3
    gpu = parse_target("cuda:0")
    batch = plan_execution(gpu, PlanRequest(command="batch", batch=64))
    assert (batch.instances, batch.instances_at_load) == (2, 1)  # the second joins while the first runs units
    assert "while it runs" in batch.choice("instances_at_load").reason
    assert plan_execution(gpu, PlanRequest(command="bench", batch=64, instances=2)).instances_at_load == 2
    assert plan_execution(gpu, PlanRequest(command="serve", max_batch=8, instances=1)).instances_at_load == 1


def test_a_pool_built_with_every_instance_has_nothing_to_join(compiled):
    pool = RunnerPool.build(compiled.new_runner, 2, name="all")
    try:
        assert pool.joining is None and pool.in_service == 2 and pool.planned == 2
        assert pool.submit(1, pool.join_step, 1).result() is False
    finally:
        pool.close()
