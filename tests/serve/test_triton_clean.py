"""What Triton's own clients and perf_analyzer need from the protocol (issue 37), checked with tritonclient against
a real server on loopback: the all-models statistics call, statistics whose queue / compute_input / compute_infer
/ compute_output counts agree (perf_analyzer aborts with "Server side statistics compute counts must be the same"
otherwise), the protocol's {"error": ...} body on unknown routes, and class_count refused alike on HTTP and gRPC
(gRPC used to ignore it and send the raw output back)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

tritonhttp = pytest.importorskip("tritonclient.http")
tritongrpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def infer_mlp(client, module, class_count=0):
    x = np.ones((2, 4), dtype=np.float32)
    tensor = module.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    outputs = [module.InferRequestedOutput("probs", class_count=class_count)] if class_count else None
    return client.infer("mlp", [tensor], outputs=outputs)


def test_all_model_statistics_and_consistent_counts_over_http(server):
    client = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    infer_mlp(client, tritonhttp)
    everything = client.get_inference_statistics()  # no model: GET /v2/models/stats
    names = {entry["name"] for entry in everything["model_stats"]}
    assert "mlp" in names and len(names) > 1
    stats = client.get_inference_statistics("mlp")["model_stats"][0]["inference_stats"]
    counts = {phase: stats[phase]["count"] for phase in PHASES}
    assert len(set(counts.values())) == 1 and counts["compute_infer"] >= 1, counts


def test_consistent_counts_over_grpc(server):
    client = tritongrpc.InferenceServerClient(server.grpc_url)
    infer_mlp(client, tritongrpc)
    stats = client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]["inference_stats"]
    counts = {phase: int(stats[phase].get("count", 0)) for phase in PHASES}
    assert len(set(counts.values())) == 1 and counts["compute_infer"] >= 1, counts
    everything = client.get_inference_statistics(as_json=True)
    assert "mlp" in {entry["name"] for entry in everything["model_stats"]}


def test_unknown_routes_answer_the_protocols_error_body(server):
    missing = httpx.get(f"{server.url}/v2/no/such/route")
    assert missing.status_code == 404 and missing.json() == {"error": "Not Found"}
    wrong_method = httpx.delete(f"{server.url}/v2/health/ready")
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def test_class_count_is_refused_alike_on_both_protocols(server):
    http = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    grpc = tritongrpc.InferenceServerClient(server.grpc_url)
    messages = []
    for client, module in ((http, tritonhttp), (grpc, tritongrpc)):
        with pytest.raises(InferenceServerException) as refused:
            infer_mlp(client, module, class_count=2)
        messages.append(refused.value.message())
    assert all("classification extension is not offered" in m for m in messages), messages
