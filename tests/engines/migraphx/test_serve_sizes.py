"""A served GPU model gets one session per padded batch size, so no session ever sees a second input shape.

Why: ONNX Runtime's CUDA convolutions keep the cuDNN plan of the last input shape only, and MIGraphX compiles
a program per shape, so a session fed batches of two sizes in turn re-plans on every run (see
docs/BENCHMARKS.md). The padded sizes make a GPU target, so this runs on
the native MIGraphX engine's stand-in (NOT EXECUTED ON AMD HARDWARE: it computes on the CPU), whose call log
shows which shape each compiled program was built for.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.repository import load_instance


def warm_the_rest(instance):
    """What serve's batcher does while the instance is idle: build and warm the sizes left for after ready."""
    while instance.pool.submit(0, instance.warm_step, 0).result():
        pass


def test_one_session_per_padded_size_each_run_at_its_own_size(fake_mgx, mlp_file):
    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_file), target="migraphx@migraphx", max_batch=8))
    try:
        assert instance.buckets == (8,) and len(instance.size_runners[0]) == 1  # ready with the largest size
        warm_the_rest(instance)
        assert instance.buckets == (1, 2, 4, 8)
        sizes = instance.size_runners[0]
        assert sorted(sizes) == [1, 2, 4, 8] and len({id(r) for r in sizes.values()}) == 4
        seen = {}
        for size, runner in sizes.items():
            real = runner.run_unchecked  # the pool runs checked feeds (serve checks them at the protocol edge)

            def spy(feeds, size=size, real=real):
                seen.setdefault(size, set()).add(next(iter(feeds.values())).shape[0])
                return real(feeds)

            runner.run_unchecked = spy
        rng = np.random.default_rng(1)
        rows = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(3)]
        outputs, _ = instance.execute_joined(0, [{"x": r} for r in rows])
        assert outputs["probs"].shape == (3, 3)
        single, _ = instance.execute(0, {"x": rows[0]})
        assert seen == {4: {4}, 1: {1}}  # three rows ran padded to 4 on the size-4 session; one row on size 1
        cpu = ort.InferenceSession(str(mlp_file), providers=["CPUExecutionProvider"])
        expected = np.concatenate([cpu.run(None, {"x": r})[0] for r in rows])
        np.testing.assert_allclose(outputs["probs"], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(single["probs"], expected[:1], rtol=1e-5, atol=1e-6)
    finally:
        instance.close()


def test_one_session_when_asked(fake_mgx, mlp_file):
    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_file), target="migraphx@migraphx", max_batch=8,
                                         session_per_batch_size=False))
    try:
        warm_the_rest(instance)
        assert instance.buckets == (1, 2, 4, 8) and instance.size_runners == []
        outputs, _ = instance.execute_joined(0, [{"x": np.ones((1, 4), np.float32)}] * 3)
        assert outputs["probs"].shape == (3, 3)
    finally:
        instance.close()


def _sequence_model(path):
    """x[batch, sequence] float -> y = x * 2 (same dims): a dynamic sequence axis, like a transformer's."""
    import onnx
    from onnx import TensorProto, helper

    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "seq",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence"])], [two])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_shape_buckets_get_a_session_each_on_a_per_shape_compiling_target(fake_mgx, tmp_path):
    """Issue 20: served with --shape-buckets on MIGraphX (which compiles per input shape), every (padded batch
    size, bucket) pair has a program of its own, compiled at its sizes, and mixed lengths answer unpadded
    results. Before, one session per batch size saw every bucket's length (a recompile on each change)."""
    from onnxaccel.engines.buckets import BucketedRunner

    path = _sequence_model(tmp_path / "seq.onnx")
    instance = load_instance(ModelConfig(name="seq", source=str(path), target="migraphx@migraphx", max_batch=2,
                                         shape_buckets="sequence=4,8"))
    try:
        runners = instance.size_runners[0]
        assert sorted(runners) == [1, 2] and all(isinstance(r, BucketedRunner) for r in runners.values())
        assert all(r.per_bucket and sorted(r.runners) == [(4,), (8,)] for r in runners.values())
        compiled = [c for name, c in fake_mgx._calls if name == "parse_onnx"]
        shapes = sorted(tuple(c["map_input_dims"]["x"]) for c in compiled)
        assert shapes == [(1, 4), (1, 8), (2, 4), (2, 8)]  # one program per (batch size, bucket), each at its size
        for length in (3, 8, 5):
            x = np.arange(length, dtype=np.float32)[None]
            padded, actual = instance.shape_buckets.bucket_for(instance.model, {"x": x})
            feeds = instance.shape_buckets.pad(instance.model, {"x": x}, padded)
            out, _ = instance.execute(0, feeds)
            out = instance.shape_buckets.crop(instance.model, out, padded, actual)
            np.testing.assert_allclose(out["y"], 2 * x)
    finally:
        instance.close()


def test_an_idle_served_model_warms_the_other_sizes_by_itself(fake_mgx, mlp_file):
    """The path a server takes (plan -> load_instance -> DynamicBatcher) on a GPU target: ready with the largest
    size, and the batcher's idle workers build and warm the others without any request."""
    import asyncio

    from onnxaccel.serve.batcher import DynamicBatcher

    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_file), target="migraphx@migraphx", max_batch=8,
                                         instances=2))

    async def idle():
        batcher = DynamicBatcher(instance)
        try:
            for _ in range(300):
                if instance.buckets == (1, 2, 4, 8):
                    break
                await asyncio.sleep(0.02)
        finally:
            await batcher.close()

    try:
        assert instance.buckets == (8,)
        asyncio.run(idle())
        assert instance.buckets == (1, 2, 4, 8)
        assert [sorted(s) for s in instance.size_runners] == [[1, 2, 4, 8]] * 2
    finally:
        instance.close()
