"""Prometheus /metrics: requests by code, latency/queue/inference histograms, batch sizes, process memory;
GPU gauges from the telemetry backends (a fake backend here: this machine has no GPU)."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from onnxaccel.serve.metrics import ServerMetrics  # noqa: E402
from onnxaccel.serve.telemetry_bridge import gpu_source  # noqa: E402


def scrape(server) -> dict:
    text = httpx.get(f"{server.url}/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_requests_errors_batches_and_memory(server):
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0]}]}
    for _ in range(3):
        assert httpx.post(f"{server.url}/v2/models/mlp/infer", json=body).status_code == 200
    httpx.post(f"{server.url}/v2/models/mlp/infer", json={"inputs": []})
    metrics = scrape(server)
    ok = metrics[("onnxaccel_requests_total", (("code", "200"), ("model", "mlp"), ("protocol", "http")))]
    bad = metrics[("onnxaccel_request_errors_total", (("code", "400"), ("model", "mlp"), ("protocol", "http")))]
    assert ok >= 3 and bad >= 1
    assert metrics[("onnxaccel_batch_size_count", (("model", "mlp"),))] >= 1
    assert metrics[("onnxaccel_inference_duration_seconds_count", (("model", "mlp"),))] >= 1
    assert metrics[("onnxaccel_queue_duration_seconds_count", (("model", "mlp"),))] >= 3
    assert metrics[("onnxaccel_model_ready", (("model", "mlp"),))] == 1
    assert metrics[("onnxaccel_model_ready", (("model", "broken"),))] == 0
    assert metrics[("process_resident_memory_bytes", ())] > 0


def test_unknown_model_names_do_not_create_label_series(server):
    httpx.post(f"{server.url}/v2/models/random-name-123/infer", json={"inputs": []})
    text = httpx.get(f"{server.url}/metrics").text
    assert "random-name-123" not in text and 'model="_unknown"' in text


class FakeGpu:
    name = "fake"

    def __init__(self):
        self.reads = 0

    def read(self):
        from onnxaccel.system.gpu_sample import GpuSample

        self.reads += 1
        return [GpuSample(gpu=0, name="Fake GPU", vendor="amd", utilization_pct=75.0,
                          memory_used_bytes=2 << 30, memory_total_bytes=16 << 30, power_w=210.0)]

    def close(self):
        pass


def test_gpu_gauges_come_from_the_telemetry_backends():
    backend = FakeGpu()
    source, stop = gpu_source(10.0, backends=[backend])
    metrics = ServerMetrics(gpu_source=source)
    text = metrics.render()[0].decode()
    metrics.render()
    assert backend.reads == 1  # a second scrape within the interval reuses the reading
    values = {(s.name, s.labels.get("gpu")): s.value
              for f in text_string_to_metric_families(text) for s in f.samples}
    assert values[("onnxaccel_gpu_utilization_ratio", "0")] == 0.75
    assert values[("onnxaccel_gpu_memory_used_bytes", "0")] == 2 << 30
    assert values[("onnxaccel_gpu_memory_total_bytes", "0")] == 16 << 30
    assert values[("onnxaccel_gpu_power_watts", "0")] == 210.0
    stop()
