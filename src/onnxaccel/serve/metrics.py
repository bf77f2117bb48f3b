"""Prometheus metrics of the server: requests, latency, queue time, batch sizes, inference time, errors,
process memory, and GPU utilization/memory/power from the telemetry sampler when one is available.

Names follow Prometheus' conventions (prometheus.io/docs/practices/naming: base units, ``_total`` for counters,
``_seconds``/``_bytes`` suffixes). Each server has its own registry, so two servers in one process (tests) do not
collide.
"""

from __future__ import annotations

from onnxaccel.errors import MissingDependencyError

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics:
    """The server's metrics in their own registry; ``render()`` gives the text exposition format."""

    def __init__(self, gpu_source=None):
        try:
            import prometheus_client as prom
        except ImportError as exc:
            raise MissingDependencyError("prometheus-client", "serve", "Serving metrics") from exc
        self._prom = prom
        self.registry = prom.CollectorRegistry()
        reg = self.registry
        prom.ProcessCollector(registry=reg)  # process_resident_memory_bytes, cpu seconds, open fds
        self.requests = prom.Counter("onnxaccel_requests_total", "Inference requests by model, protocol and "
                                     "status code.", ["model", "protocol", "code"], registry=reg)
        self.errors = prom.Counter("onnxaccel_request_errors_total", "Failed inference requests by model, "
                                   "protocol and status code.", ["model", "protocol", "code"], registry=reg)
        self.latency = prom.Histogram("onnxaccel_request_duration_seconds", "Inference request latency inside "
                                      "the server (decode, queue, run, encode).", ["model", "protocol"],
                                      buckets=LATENCY_BUCKETS, registry=reg)
        self.queue = prom.Histogram("onnxaccel_queue_duration_seconds", "Time a request waited for its batch.",
                                    ["model"], buckets=LATENCY_BUCKETS, registry=reg)
        self.compute = prom.Histogram("onnxaccel_inference_duration_seconds", "Time of one model run (one "
                                      "batch).", ["model"], buckets=LATENCY_BUCKETS, registry=reg)
        self.batch = prom.Histogram("onnxaccel_batch_size", "Rows per model run (dynamic batch size).", ["model"],
                                    buckets=BATCH_BUCKETS, registry=reg)
        self.inflight = prom.Gauge("onnxaccel_inflight_requests", "Inference requests being handled.",
                                   registry=reg)
        self.queue_length = prom.Gauge("onnxaccel_queue_length", "Requests waiting in a model's queue.",
                                       ["model"], registry=reg)
        self.model_ready = prom.Gauge("onnxaccel_model_ready", "1 when the model is loaded and ready.",
                                      ["model"], registry=reg)
        if gpu_source is not None:
            reg.register(_GpuCollector(prom, gpu_source))

    def observe_request(self, model: str, protocol: str, code: int | str, seconds: float) -> None:
        self.requests.labels(model, protocol, str(code)).inc()
        if str(code) not in ("200", "OK"):
            self.errors.labels(model, protocol, str(code)).inc()
        else:
            self.latency.labels(model, protocol).observe(seconds)

    def batch_observer(self, model: str):
        batch, compute = self.batch.labels(model), self.compute.labels(model)

        def observe(rows: int, seconds: float) -> None:
            batch.observe(rows)
            compute.observe(seconds)

        return observe

    def render(self) -> tuple[bytes, str]:
        return self._prom.generate_latest(self.registry), self._prom.CONTENT_TYPE_LATEST


class _GpuCollector:
    """GPU gauges read at scrape time from the latest telemetry sample (``gpu_source()`` -> list of dicts
    with index, name, utilization_pct, memory_used_bytes, memory_total_bytes, power_watts; None skips)."""

    def __init__(self, prom, source):
        self._prom = prom
        self._source = source

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        families = {
            "utilization_pct": GaugeMetricFamily("onnxaccel_gpu_utilization_ratio", "GPU busy fraction (0-1).",
                                                 labels=["gpu", "name"]),
            "memory_used_bytes": GaugeMetricFamily("onnxaccel_gpu_memory_used_bytes", "GPU memory in use.",
                                                   labels=["gpu", "name"]),
            "memory_total_bytes": GaugeMetricFamily("onnxaccel_gpu_memory_total_bytes", "GPU memory size.",
                                                    labels=["gpu", "name"]),
            "power_watts": GaugeMetricFamily("onnxaccel_gpu_power_watts", "GPU board power.",
                                             labels=["gpu", "name"]),
        }
        try:
            samples = self._source() or []
        except Exception:  # noqa: BLE001 - a failing GPU query must not break the scrape
            samples = []
        for sample in samples:
            labels = [str(sample.get("index", "?")), str(sample.get("name", ""))]
            for key, family in families.items():
                value = sample.get(key)
                if value is None:
                    continue
                family.add_metric(labels, value / 100.0 if key == "utilization_pct" else float(value))
        yield from families.values()
