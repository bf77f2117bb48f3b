"""The model repository: a model that fails to load leaves the others serving; load/unload through the
protocol's repository endpoints (HTTP and gRPC, by tritonclient); a model added to the folder later loads."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.conftest import make_mlp
from tests.serve.conftest import write_config

tritonhttp = pytest.importorskip("tritonclient.http")
tritongrpc = pytest.importorskip("tritonclient.grpc")


def mlp_ok(server) -> bool:
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0]}]}
    return httpx.post(f"{server.url}/v2/models/mlp/infer", json=body, timeout=30).status_code == 200


def test_a_broken_model_does_not_take_the_others_down(server):
    index = {m["name"]: m for m in httpx.post(f"{server.url}/v2/repository/index").json()}
    assert index["broken"]["state"] == "UNAVAILABLE" and "not an ONNX model" in index["broken"]["reason"]
    assert {index[n]["state"] for n in ("mlp", "cls", "fixed", "echo")} == {"READY"}
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    assert httpx.get(f"{server.url}/v2/models/broken/ready").status_code == 400
    assert mlp_ok(server)
    ready_only = httpx.post(f"{server.url}/v2/repository/index", json={"ready": True}).json()
    assert "broken" not in {m["name"] for m in ready_only}


def test_load_of_a_broken_model_fails_with_its_reason(server):
    client = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    with pytest.raises(tritonhttp.InferenceServerException) as failed:
        client.load_model("broken")
    assert "not an ONNX model" in failed.value.message()
    with pytest.raises(tritonhttp.InferenceServerException) as unknown:
        client.load_model("no-such-model")
    assert unknown.value.status() == "404"
    assert mlp_ok(server)


def test_unload_and_reload_over_http_and_grpc(server):
    http = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    grpc = tritongrpc.InferenceServerClient(server.grpc_url)
    http.unload_model("fixed")
    assert not http.is_model_ready("fixed")
    body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [0.0] * 8}]}
    response = httpx.post(f"{server.url}/v2/models/fixed/infer", json=body)
    assert response.status_code == 503 and "unloaded" in response.json()["error"]
    grpc.load_model("fixed")
    assert grpc.is_model_ready("fixed")
    grpc.unload_model("fixed")
    assert not grpc.is_model_ready("fixed")
    http.load_model("fixed")
    assert http.is_model_ready("fixed")
    assert httpx.post(f"{server.url}/v2/models/fixed/infer", json=body).status_code == 200


def test_a_model_added_to_the_folder_after_start_can_be_loaded(server, model_repo):
    folder = model_repo / "late"
    folder.mkdir(exist_ok=True)
    make_mlp(folder / "model.onnx")
    write_config(folder, max_batch=2, instances=2)
    client = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    client.load_model("late")
    assert client.get_model_config("late")["instance_group"][0]["count"] == 2
    inp = tritonhttp.InferInput("x", [2, 4], "FP32")
    inp.set_data_from_numpy(np.ones((2, 4), np.float32))
    assert client.infer("late", [inp]).as_numpy("probs").shape == (2, 3)
    client.unload_model("late")


def test_a_bad_config_is_reported_as_the_load_failure(server, model_repo):
    folder = model_repo / "badconfig"
    folder.mkdir(exist_ok=True)
    make_mlp(folder / "model.onnx")
    write_config(folder, max_bach=4)
    response = httpx.post(f"{server.url}/v2/repository/models/badconfig/load")
    assert response.status_code == 400 and "unknown key(s): max_bach" in response.json()["error"]
