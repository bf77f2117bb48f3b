"""Dynamic batching: concurrent requests are joined into fewer model runs, and each request gets exactly the
rows an unbatched run of its own input gives.

Why bit-identical is the right assertion here: for these two models, ONNX Runtime's CPU kernels compute each
row of a batch independently with the same instruction sequence whatever the batch size (checked in-process
below as a precondition, so a failure points at the model/runtime and not at the server). On GPUs, cuDNN/
MIOpen may pick other algorithms per batch size and rows may differ in the last bits; there only closeness holds.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import numpy as np
import onnxruntime as ort
import pytest

tritongrpc = pytest.importorskip("tritonclient.grpc")


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def unbatched(sess, x: np.ndarray) -> np.ndarray:
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))])


def stats(server, model):
    doc = httpx.get(f"{server.url}/v2/models/{model}/stats").json()["model_stats"][0]
    return doc["inference_stats"]["success"]["count"], doc["execution_count"]


@pytest.mark.parametrize("model,row_shape,requests", [("mlp", (4,), 96), ("cls", (3, 48, 192), 24)])
def test_concurrent_http_requests_are_batched_and_each_gets_its_own_rows(server, model_repo, model, row_shape,
                                                                         requests):
    rng = np.random.default_rng(11)
    rows = rng.integers(1, 3, size=requests)  # 1 or 2 rows per request
    inputs = [rng.random((int(n), *row_shape), dtype=np.float32) for n in rows]
    sess = session(model_repo / model / "model.onnx")
    everything = np.concatenate(inputs)
    # Precondition: in-process, batching this model does not change any row.
    name = sess.get_inputs()[0].name
    assert np.array_equal(sess.run(None, {name: everything[:4]})[0], unbatched(sess, everything[:4]))

    async def send_all():
        async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                     limits=httpx.Limits(max_connections=requests)) as client:
            async def one(x):
                head = json.dumps({"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                                               "parameters": {"binary_data_size": x.nbytes}}],
                                   "parameters": {"binary_data_output": True}}).encode()
                response = await client.post(f"/v2/models/{model}/infer", content=head + x.tobytes(),
                                             headers={"Inference-Header-Content-Length": str(len(head))})
                assert response.status_code == 200, response.text
                json_len = int(response.headers["Inference-Header-Content-Length"])
                meta = json.loads(response.content[:json_len])["outputs"][0]
                return np.frombuffer(response.content[json_len:], np.float32).reshape(meta["shape"])
            return await asyncio.gather(*(one(x) for x in inputs))

    before = stats(server, model)
    results = asyncio.run(send_all())
    after = stats(server, model)
    for x, got in zip(inputs, results):
        assert np.array_equal(got, unbatched(sess, x))  # bit-identical, row for row
    served, runs = after[0] - before[0], after[1] - before[1]
    assert served == requests
    assert runs < requests, f"{requests} requests ran as {runs} model runs: nothing was batched"


def test_concurrent_grpc_requests_are_batched_and_correct(server, model_repo):
    client = tritongrpc.InferenceServerClient(server.grpc_url)
    sess = session(model_repo / "mlp" / "model.onnx")
    rng = np.random.default_rng(5)
    inputs = [rng.random((1, 4), dtype=np.float32) for _ in range(48)]
    results, done = {}, threading.Semaphore(0)

    def callback(i):
        def cb(result, error):
            results[i] = error or result.as_numpy("probs")
            done.release()
        return cb

    before = stats(server, "mlp")
    for i, x in enumerate(inputs):
        inp = tritongrpc.InferInput("x", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        client.async_infer("mlp", [inp], callback(i))
    for _ in inputs:
        assert done.acquire(timeout=60)
    after = stats(server, "mlp")
    for i, x in enumerate(inputs):
        assert isinstance(results[i], np.ndarray), results[i]
        assert np.array_equal(results[i], unbatched(sess, x))
    assert after[1] - before[1] < len(inputs)


def test_model_without_batch_axis_runs_each_request_alone(server, model_repo):
    sess = session(model_repo / "fixed" / "model.onnx")
    x = np.random.default_rng(3).random((2, 4), dtype=np.float32)
    body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.reshape(-1).tolist()}]}
    before = stats(server, "fixed")

    async def send_all():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(*(client.post("/v2/models/fixed/infer", json=body) for _ in range(8)))

    responses = asyncio.run(send_all())
    after = stats(server, "fixed")
    expected = sess.run(None, {"x": x})[0]
    for response in responses:
        assert response.status_code == 200
        np.testing.assert_array_equal(np.asarray(response.json()["outputs"][0]["data"], np.float32).reshape(2, 3),
                                      expected)
    assert after[1] - before[1] == 8  # one run per request


def test_a_request_past_its_deadline_leaves_the_queue_unrun(mlp_path):
    """The batcher's own deadline (what the model process of --shared-models relies on): a request still queued
    when its time is up is answered 503 and never run; one already running finishes."""
    import time

    from onnxaccel.serve.batcher import DynamicBatcher
    from onnxaccel.serve.config import ModelConfig
    from onnxaccel.serve.protocol import ProtocolError
    from onnxaccel.serve.repository import load_instance

    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=8,
                                         max_queue_delay_ms=0))
    x = np.ones((1, 4), dtype=np.float32)

    async def scenario():
        batcher = DynamicBatcher(instance)
        try:
            # Keep the instance's one run thread busy, so that the requests below wait in the queue.
            blocker = asyncio.get_running_loop().run_in_executor(instance.threads[0], time.sleep, 0.4)
            first = asyncio.ensure_future(batcher.submit({"x": x}, 1))  # taken at once, runs after the blocker
            await asyncio.sleep(0.05)
            late = asyncio.ensure_future(batcher.submit({"x": x}, 1, timeout_s=0.1))
            patient = asyncio.ensure_future(batcher.submit({"x": x}, 1))
            await blocker
            outputs, _ = await first
            with pytest.raises(ProtocolError) as refused:
                await late
            await patient
            return outputs, refused.value, batcher.executions
        finally:
            await batcher.close()

    try:
        outputs, error, executions = asyncio.run(scenario())
    finally:
        instance.close()
    assert outputs["probs"].shape[0] == 1
    assert error.status == 503 and "in the queue" in error.message
    assert executions == 2  # the first and the patient one; the late one never ran


def _record_batches(instance, submits):
    """Run ``submits`` (delay seconds, rows) against a DynamicBatcher of ``instance``; the rows of each run."""
    from onnxaccel.serve.batcher import DynamicBatcher

    runs = []

    async def scenario():
        batcher = DynamicBatcher(instance, on_batch=lambda rows, seconds, phases: runs.append(rows))
        try:
            started = asyncio.get_running_loop().time()
            futures = []
            for at, rows in submits:
                await asyncio.sleep(max(0.0, started + at - asyncio.get_running_loop().time()))
                futures.append(asyncio.ensure_future(batcher.submit({"x": np.ones((rows, 4), np.float32)}, rows)))
            results = await asyncio.gather(*futures)
            return [r[0]["probs"].shape[0] for r in results]
        finally:
            await batcher.close()

    return asyncio.run(scenario()), runs


def test_two_idle_instances_form_one_batch_at_a_time(mlp_path):
    """With two instances, a full batch goes to one; the rows left over wait their own queue delay for more,
    as Triton's scheduler forms one batch at a time. (Before, both idle instances waited for the same first
    request, and the second ran the leftovers when that request's delay ran out: 4, 2, 2 here.)"""
    from onnxaccel.serve.config import ModelConfig
    from onnxaccel.serve.repository import load_instance

    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=4,
                                         max_queue_delay_ms=600, instances=2))
    try:
        # 2 rows at 0 s and 4 at 0.3 s: 4 run at once (full); the other 2 wait until 0.9 s for more, so the 2
        # sent at 0.75 s join them.
        answered, runs = _record_batches(instance, [(0.0, 1)] * 2 + [(0.3, 1)] * 4 + [(0.75, 1)] * 2)
    finally:
        instance.close()
    assert answered == [1] * 8
    assert runs == [4, 4]


@pytest.mark.parametrize("max_padding,expected", [(0.25, [4, 1]), (1.0, [5])])
def test_padded_batches_are_cut_where_padding_would_exceed_max_padding(mlp_path, max_padding, expected):
    """Models run in padded sizes (GPUs; here the CPU with the sizes set as a GPU would get them): 5 waiting rows
    would run as 8 with 3 of padding (37 %); under max_padding 0.25 they run as 4 and then 1."""
    from onnxaccel.serve.config import ModelConfig
    from onnxaccel.serve.repository import load_instance

    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=8,
                                         max_queue_delay_ms=100, max_padding=max_padding))
    instance.buckets = (1, 2, 4, 8)
    try:
        answered, runs = _record_batches(instance, [(0.0, 1)] * 5)
    finally:
        instance.close()
    assert answered == [1] * 5
    assert runs == expected


def test_fit_rows_takes_all_waiting_rows_unless_padding_exceeds_the_limit(mlp_path):
    from onnxaccel.errors import UsageError
    from onnxaccel.serve.config import ModelConfig
    from onnxaccel.serve.repository import load_instance

    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=64))
    try:
        assert instance.fit_rows(13) == 13  # CPU: no padded sizes, nothing is cut
        instance.buckets = (1, 2, 4, 8, 16, 32, 64)
        fits = {n: instance.fit_rows(n) for n in (1, 3, 5, 13, 17, 24, 40, 50, 64, 70)}
    finally:
        instance.close()
    assert fits == {1: 1, 3: 3, 5: 4, 13: 13, 17: 16, 24: 24, 40: 32, 50: 50, 64: 64, 70: 64}
    with pytest.raises(UsageError, match="max_padding"):
        ModelConfig(name="m", source="m.onnx", max_padding=1.5)


def test_a_cut_is_kept_only_where_it_pads_less(mlp_path):
    """Two requests of 10 rows (max_batch 32, padded sizes): a cut to 16 would run them as two batches of 10, each
    padded to 16 (as much padding as one batch of 20 padded to 32, and two runs): they run together."""
    from onnxaccel.serve.config import ModelConfig
    from onnxaccel.serve.repository import load_instance

    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=32,
                                         max_queue_delay_ms=100))
    instance.buckets = (1, 2, 4, 8, 16, 32)
    try:
        answered, runs = _record_batches(instance, [(0.0, 10), (0.0, 10)])
    finally:
        instance.close()
    assert answered == [10, 10]
    assert runs == [20]
