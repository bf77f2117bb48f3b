"""Prometheus metrics of the server: requests, latency, queue time, batch sizes, inference time, errors,
process memory, and GPU utilization/memory/power from the telemetry sampler when one is available.

Names follow Prometheus' conventions (prometheus.io/docs/practices/naming: base units, ``_total`` for counters,
``_seconds``/``_bytes`` suffixes). Each server has its own registry, so two servers in one process (tests) do not
collide.

With several worker processes (``serve --workers N``) the values live in prometheus_client's multiprocess
files (``PROMETHEUS_MULTIPROC_DIR``, prometheus/client_python docs "Multiprocess Mode"): every worker writes its
own, and a scrape, answered by any worker, adds them up. Gauges say how (``livesum`` for in-flight and queued
requests, ``livemin`` for readiness: 1 only when every live worker has the model). ``process_*`` metrics and the
GPU readings come from the worker that answers the scrape.

Triton's statistics extension (``/v2/models/stats``) is computed from these same metrics (:meth:`model_stats`), so
it is summed over workers too and there is one bookkeeping, not two.
"""

from __future__ import annotations

from onnxaccel.errors import MissingDependencyError

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics:
    """The server's metrics in their own registry; ``render()`` gives the text exposition format."""

    def __init__(self, gpu_source=None, multiprocess_dir: str | None = None):
        try:
            import prometheus_client as prom
        except ImportError as exc:
            raise MissingDependencyError("prometheus-client", "serve", "Serving metrics") from exc
        self._prom = prom
        self.multiprocess_dir = multiprocess_dir
        self._gpu = _GpuCollector(prom, gpu_source) if gpu_source is not None else None
        self.registry = prom.CollectorRegistry()
        reg = self.registry
        if multiprocess_dir is None:
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
        self.phase = prom.Histogram("onnxaccel_batch_phase_seconds", "Time of each phase of a batch: join (requests "
                                    "copied into the batch buffer), run; with graph capture copy_in, replay, "
                                    "copy_out; turn: the wait for the run's turn (--streams serial).",
                                    ["model", "phase"], buckets=LATENCY_BUCKETS, registry=reg)
        self.request_compute = prom.Counter("onnxaccel_request_compute_seconds_total", "Seconds of model runs "
                                            "summed over successful requests (each counts the run of its batch).",
                                            ["model"], registry=reg)
        self.failure_seconds = prom.Counter("onnxaccel_request_failure_seconds_total", "Seconds spent in the "
                                            "server by failed inference requests.", ["model"], registry=reg)
        self.last_inference = prom.Gauge("onnxaccel_last_inference_timestamp_seconds", "Unix time of the "
                                         "model's last successful request.", ["model"], registry=reg,
                                         multiprocess_mode="max")
        self.inflight = prom.Gauge("onnxaccel_inflight_requests", "Inference requests being handled.",
                                   registry=reg, multiprocess_mode="livesum")
        self.queue_length = prom.Gauge("onnxaccel_queue_length", "Requests waiting in a model's queue.",
                                       ["model"], registry=reg, multiprocess_mode="livesum")
        self.model_ready = prom.Gauge("onnxaccel_model_ready", "1 when the model is loaded and ready.",
                                      ["model"], registry=reg, multiprocess_mode="livemin")
        self.startup_seconds = prom.Gauge("onnxaccel_startup_seconds", "Seconds each start-up stage took in "
                                          "a process (summed over its models, instances and sizes).",
                                          ["process", "stage"], registry=reg, multiprocess_mode="max")
        self.ready_seconds = prom.Gauge("onnxaccel_time_to_ready_seconds", "Seconds from a process's start until "
                                        "it was ready.", ["process"], registry=reg, multiprocess_mode="max")
        self.rejected = prom.Counter("onnxaccel_rejected_requests_total", "HTTP requests refused before any "
                                     "model saw them, by reason: auth (401), body_too_large (413), inflight_budget "
                                     "(503, --max-inflight-mb), body_timeout and header_timeout (408), "
                                     "connections (503, --max-connections), header_too_large (431).", ["reason"],
                                     registry=reg)
        if self._gpu is not None and multiprocess_dir is None:
            reg.register(self._gpu)
        #: Labelled children by (metric, labels): ``labels()`` takes a lock and builds its key on every call,
        #: a few µs of the event loop's time per request. Label sets are bounded (models, protocols, codes).
        self._children: dict[tuple, object] = {}

    def child(self, metric, *labels: str):
        """``metric.labels(*labels)``, remembered."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def reject(self, reason: str) -> None:
        """Count one request refused before routing (HttpGuard, the HTTP protocol's limits)."""
        self.child(self.rejected, reason).inc()

    def observe_startup(self, process: str, started: dict) -> None:
        """Set the start-up gauges from ``Startup.to_dict()`` of ``process`` (a worker, the model process)."""
        for row in started.get("stages", ()):
            self.startup_seconds.labels(process, row["stage"]).set(row["seconds"])
        if started.get("to_ready_s") is not None:
            self.ready_seconds.labels(process).set(started["to_ready_s"])

    def observe_request(self, model: str, protocol: str, code: int | str, seconds: float) -> None:
        """Count one request of ``model`` over ``protocol`` with its status ``code`` and time it; a failure
        is counted as an error too."""
        code = str(code)
        self.child(self.requests, model, protocol, code).inc()
        if code not in ("200", "OK"):
            self.child(self.errors, model, protocol, code).inc()
            self.child(self.failure_seconds, model).inc(seconds)
        else:
            self.child(self.latency, model, protocol).observe(seconds)

    def observe_success(self, model: str, queue_s: float, compute_s: float, when: float) -> None:
        """What the service learns of a successful request: its queue time, its batch's run, the time."""
        self.child(self.queue, model).observe(queue_s)
        self.child(self.request_compute, model).inc(compute_s)
        self.child(self.last_inference, model).set(when)

    def batch_observer(self, model: str):
        """A callback for ``model``'s batcher that records each executed batch: rows, compute seconds and
        per-phase seconds."""
        batch, compute = self.batch.labels(model), self.compute.labels(model)

        def observe(rows: int, seconds: float, phases: dict[str, float] | None = None) -> None:
            batch.observe(rows)
            compute.observe(seconds)
            for phase, spent in (phases or {}).items():
                self.phase.labels(model, phase).observe(spent)

        return observe

    def collecting_registry(self):
        """The registry a scrape reads: this server's, or with workers, every worker's files added up."""
        if self.multiprocess_dir is None:
            return self.registry
        from prometheus_client import multiprocess

        reg = self._prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(reg, path=self.multiprocess_dir)
        self._prom.ProcessCollector(registry=reg)
        if self._gpu is not None:
            reg.register(self._gpu)
        return reg

    def render(self) -> tuple[bytes, str]:
        """The metrics in Prometheus text format and its content type, for GET /metrics."""
        return self._prom.generate_latest(self.collecting_registry()), self._prom.CONTENT_TYPE_LATEST

    def model_stats(self, names: list[str]) -> dict[str, dict]:
        """Per model, the numbers of Triton's statistics extension, read back from the metrics."""
        want = set(names)
        stats = {n: {"success_count": 0.0, "success_s": 0.0, "fail_count": 0.0, "fail_s": 0.0, "queue_s": 0.0,
                     "served": 0.0,
                     "compute_s": 0.0, "rows": 0.0, "executions": 0.0, "last": 0.0} for n in names}
        fields = {  # sample name -> stats key (summed over protocols and workers)
            "onnxaccel_request_duration_seconds_count": "success_count",
            "onnxaccel_request_duration_seconds_sum": "success_s",
            "onnxaccel_request_errors_total": "fail_count",
            "onnxaccel_request_failure_seconds_total": "fail_s",
            "onnxaccel_queue_duration_seconds_sum": "queue_s",
            "onnxaccel_queue_duration_seconds_count": "served",
            "onnxaccel_request_compute_seconds_total": "compute_s",
            "onnxaccel_batch_size_sum": "rows",
            "onnxaccel_batch_size_count": "executions",
        }
        for family in self.collecting_registry().collect():
            if not family.name.startswith("onnxaccel_"):
                continue
            for sample in family.samples:
                model = sample.labels.get("model")
                if model not in want:
                    continue
                if sample.name == "onnxaccel_last_inference_timestamp_seconds":
                    stats[model]["last"] = max(stats[model]["last"], sample.value)
                elif sample.name in fields:
                    stats[model][fields[sample.name]] += sample.value
        return stats


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
