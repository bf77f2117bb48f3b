"""Unchanged, independent clients against the real server: tritonclient over HTTP and gRPC, JSON and binary
tensors; results equal an in-process ONNX Runtime run of the same model and input."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

tritonhttp = pytest.importorskip("tritonclient.http")
tritongrpc = pytest.importorskip("tritonclient.grpc")


def reference(path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.fixture(scope="module")
def image_batch() -> np.ndarray:
    return np.random.default_rng(7).random((3, 3, 48, 192), dtype=np.float32)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_http_infer_matches_in_process_run(server, model_repo, image_batch, binary):
    client = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("cls")
    inp = tritonhttp.InferInput("x", list(image_batch.shape), "FP32")
    inp.set_data_from_numpy(image_batch, binary_data=binary)
    meta = client.get_model_metadata("cls")
    out_name = meta["outputs"][0]["name"]
    result = client.infer("cls", [inp], outputs=[tritonhttp.InferRequestedOutput(out_name, binary_data=binary)],
                          request_id="req-1")
    got = result.as_numpy(out_name)
    np.testing.assert_array_equal(got, reference(model_repo / "cls" / "model.onnx", image_batch))
    assert result.get_response()["id"] == "req-1"


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_http_mlp_json_and_binary_agree(server, model_repo, binary):
    client = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    inp = tritonhttp.InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    result = client.infer("mlp", [inp])
    np.testing.assert_array_equal(result.as_numpy("probs"), reference(model_repo / "mlp" / "model.onnx", x))


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_tritonclient_http_compressed_request(server, model_repo, compression):
    client = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    x = np.ones((1, 4), np.float32)
    inp = tritonhttp.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    result = client.infer("mlp", [inp], request_compression_algorithm=compression)
    np.testing.assert_array_equal(result.as_numpy("probs"), reference(model_repo / "mlp" / "model.onnx", x))


def test_tritonclient_http_model_config_and_statistics(server):
    client = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    config = client.get_model_config("mlp")
    assert config["max_batch_size"] == 16 and config["input"][0]["dims"] == [4]
    assert client.get_model_config("fixed")["max_batch_size"] == 0  # fixed first axis: no batching
    stats = client.get_inference_statistics("mlp")["model_stats"][0]
    assert stats["name"] == "mlp" and "success" in stats["inference_stats"]
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["mlp"]["state"] == "READY" and index["broken"]["state"] == "UNAVAILABLE"
    assert client.get_server_metadata()["name"] == "onnxaccel"


@pytest.mark.parametrize("raw", [True, False], ids=["raw-contents", "typed-contents"])
def test_tritonclient_grpc_infer_matches_in_process_run(server, model_repo, image_batch, raw):
    client = tritongrpc.InferenceServerClient(server.grpc_url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("cls")
    inp = tritongrpc.InferInput("x", list(image_batch.shape), "FP32")
    if raw:
        inp.set_data_from_numpy(image_batch)  # tritonclient sends raw_input_contents
    else:
        inp._get_tensor().contents.fp32_contents.extend(image_batch.reshape(-1).tolist())
    meta = client.get_model_metadata("cls", as_json=True)
    out_name = meta["outputs"][0]["name"]
    result = client.infer("cls", [inp], request_id="g-1")
    np.testing.assert_array_equal(result.as_numpy(out_name), reference(model_repo / "cls" / "model.onnx",
                                                                      image_batch))
    assert result.get_response().id == "g-1"


def test_tritonclient_grpc_metadata_config_statistics_index(server):
    client = tritongrpc.InferenceServerClient(server.grpc_url)
    assert client.get_server_metadata(as_json=True)["name"] == "onnxaccel"
    meta = client.get_model_metadata("mlp", as_json=True)
    assert meta["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}
    config = client.get_model_config("mlp", as_json=True)["config"]
    assert config["max_batch_size"] == 16 and config["input"][0]["data_type"] == "TYPE_FP32"
    stats = client.get_inference_statistics("mlp", as_json=True)
    assert stats["model_stats"][0]["name"] == "mlp"
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index["broken"]["state"] == "UNAVAILABLE" and "not an ONNX model" in index["broken"]["reason"]


def test_tritonclient_grpc_errors_carry_status_and_message(server):
    client = tritongrpc.InferenceServerClient(server.grpc_url)
    inp = tritongrpc.InferInput("x", [1, 5], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 5), np.float32))
    with pytest.raises(tritongrpc.InferenceServerException) as bad:
        client.infer("mlp", [inp])
    assert bad.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "axis 1" in bad.value.message() and "[1, 5]" in bad.value.message()
    with pytest.raises(tritongrpc.InferenceServerException) as missing:
        client.infer("nope", [inp])
    assert missing.value.status() == "StatusCode.NOT_FOUND"


def test_tritonclient_grpc_stream_answers_each_request_and_errors_in_the_stream(server, model_repo):
    """ModelStreamInfer (Triton's bidirectional stream; perf_analyzer --streaming uses it): every request is
    answered once, matched by id; a bad request's error comes back in the stream and later requests still run."""
    import queue

    client = tritongrpc.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    rng = np.random.default_rng(11)
    sent = {}
    try:
        for i in range(12):
            rows = 1 + i % 3
            x = rng.random((rows, 4), dtype=np.float32)
            inp = tritongrpc.InferInput("x", [rows, 4], "FP32")
            inp.set_data_from_numpy(x)
            client.async_stream_infer("mlp", [inp], request_id=f"s-{i}")
            sent[f"s-{i}"] = x
            if i == 5:  # a bad one in the middle: a wrong trailing axis
                bad = tritongrpc.InferInput("x", [1, 5], "FP32")
                bad.set_data_from_numpy(np.zeros((1, 5), np.float32))
                client.async_stream_infer("mlp", [bad], request_id="bad")
        got, errors = {}, []
        for _ in range(13):
            result, error = results.get(timeout=30)
            if error is not None:
                errors.append(error)
            else:
                got[result.get_response().id] = result.as_numpy("probs")
    finally:
        client.stop_stream()
    assert len(errors) == 1 and "axis 1" in errors[0].message() and "[1, 5]" in errors[0].message()
    assert sorted(got) == sorted(sent)
    path = model_repo / "mlp" / "model.onnx"
    for rid, x in sent.items():
        np.testing.assert_allclose(got[rid], reference(path, x), rtol=1e-6, atol=1e-7)
    assert results.empty()
