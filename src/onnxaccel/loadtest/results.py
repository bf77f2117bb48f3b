"""What a load test is asked to do and what it measured: per concurrency level, throughput, client-side
latency percentiles, errors by status and the server's own queue and compute time."""

from __future__ import annotations

from dataclasses import dataclass, field

from onnxaccel.bench.stats import LatencyStats

SCHEMA = "onnxaccel.loadtest/1"


@dataclass(frozen=True)
class LoadtestConfig:
    """The server, the model, the transport, and the concurrency levels with how long to hold each."""

    url: str
    model: str
    protocol: str = "http"  # or "grpc"
    binary: bool = False
    concurrency: tuple[int, ...] = (1, 8, 32)
    duration_s: float = 10.0
    warmup_s: float = 2.0
    batch: int = 1
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    workers: int = 0  # 0: automatic
    max_requests: int | None = None  # per level, across workers
    timeout_s: float = 30.0
    grpc_url: str | None = None  # host:port; default: the URL's host with port 8001
    seed: int = 0
    #: ``sequence=20,50,100,200``: requests cycle through these sizes on every dynamic non-batch axis (None: one
    #: shape for every request).
    shape_mix: str | None = None
    #: A folder of JPEG/PNG files sent as encoded images (BYTES, one file per row), round robin (None: tensors).
    images: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"url": self.url, "grpc_url": self.grpc_url, "model": self.model, "protocol": self.protocol,
                "binary": self.binary, "concurrency": list(self.concurrency), "duration_s": self.duration_s,
                "warmup_s": self.warmup_s, "batch": self.batch, "workers": self.workers,
                "max_requests": self.max_requests, "shapes": {k: list(v) for k, v in self.shapes.items()},
                "shape_mix": self.shape_mix, "images": self.images}


@dataclass
class LevelResult:
    """One concurrency level: successful requests, errors by code, latency over the measured seconds."""

    concurrency: int
    requests: int
    errors: dict[str, int]
    seconds: float
    #: The rows each request carried (axis 0 as sent: ``--batch``, or what ``--shape INPUT=DIMS`` gives there).
    batch: int
    latency: LatencyStats | None
    server_queue_ms: float | None = None
    server_compute_ms: float | None = None
    #: The first error message seen per code (the server's answer, or the client-side exception).
    error_samples: dict[str, str] = field(default_factory=dict)
    #: Whether the rows were encoded images (then rows/s is images/s).
    images: bool = False

    @property
    def throughput(self) -> float:
        """Successful requests per second."""
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def inferences_per_s(self) -> float:
        """Rows per second: successful requests per second times the rows each carried."""
        return self.throughput * self.batch

    def to_dict(self) -> dict:
        """JSON-ready form, with the derived rates."""
        return {"concurrency": self.concurrency, "requests": self.requests, "errors": self.errors,
                "error_count": sum(self.errors.values()), "seconds": self.seconds,
                "requests_per_s": self.throughput, "rows_per_request": self.batch,
                "inferences_per_s": self.inferences_per_s,
                "images_per_s": self.inferences_per_s if self.images else None,
                "latency": self.latency.to_dict() if self.latency else None,
                "server_queue_ms": self.server_queue_ms, "server_compute_ms": self.server_compute_ms,
                "error_samples": self.error_samples}


@dataclass
class LoadtestReport:
    """The whole test: its config, the server's self-description, the input shapes sent, every level."""

    config: LoadtestConfig
    server: dict
    input_shapes: dict[str, list[int]]
    levels: list[LevelResult]

    def to_dict(self) -> dict:
        """JSON-ready form, versioned by SCHEMA."""
        return {"schema": SCHEMA, "config": self.config.to_dict(), "server": self.server,
                "input_shapes": self.input_shapes, "levels": [lv.to_dict() for lv in self.levels]}
