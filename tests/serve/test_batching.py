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
