"""A served GPU model gets one session per padded batch size, so no session ever sees a second input shape.

Why: ONNX Runtime's CUDA convolutions keep the cuDNN plan of the last input shape only, and MIGraphX compiles
a program per shape; on an H200 a ResNet-50 session fed batches of 8 and 16 in turn took ~220 ms per run
instead of ~3.5 ms (benchmarks/serve_session_probe.py). The padded sizes make a GPU target, so this runs on
the native MIGraphX engine's stand-in (NOT EXECUTED ON AMD HARDWARE: it computes on the CPU), whose call log
shows which shape each compiled program was built for.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.repository import load_instance


def test_one_session_per_padded_size_each_run_at_its_own_size(fake_mgx, mlp_file):
    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_file), target="migraphx@migraphx", max_batch=8))
    try:
        assert instance.buckets == (1, 2, 4, 8)
        sizes = instance.size_runners[0]
        assert sorted(sizes) == [1, 2, 4, 8] and len({id(r) for r in sizes.values()}) == 4
        seen = {}
        for size, runner in sizes.items():
            real = runner.run

            def spy(feeds, size=size, real=real):
                seen.setdefault(size, set()).add(next(iter(feeds.values())).shape[0])
                return real(feeds)

            runner.run = spy
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
        assert instance.buckets == (1, 2, 4, 8) and instance.size_runners == []
        outputs, _ = instance.execute_joined(0, [{"x": np.ones((1, 4), np.float32)}] * 3)
        assert outputs["probs"].shape == (3, 3)
    finally:
        instance.close()
