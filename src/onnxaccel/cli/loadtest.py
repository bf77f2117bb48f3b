"""`onnxaccel loadtest`: throughput and latency of an Open Inference Protocol server per concurrency level."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import typer
from rich.markup import escape

from onnxaccel.cli.args_data import OutputArgs
from onnxaccel.cli.args_model import ShapeArgs
from onnxaccel.cli.common import console, err_console, handle_errors, print_json
from onnxaccel.cli.compose import REQUIRED, Built, Group, argument, composed, option
from onnxaccel.cli.tables import columns, new_table, si
from onnxaccel.errors import UsageError

#: The order of the options in --help.
ORDER = ("url model concurrency duration warmup protocol grpc_url binary batch shape shape_mix images workers "
         "max_requests timeout report as_json")


class EndpointArgs(Group):
    """The server under test: URL, --model, --protocol, --grpc-url, --binary, --timeout. Builds their values
    (an http:// URL, the protocol lower-cased)."""

    PARAMS = (
        argument("url", str, REQUIRED, help="The server's HTTP URL, e.g. http://127.0.0.1:8000 (metadata is read "
                 "over HTTP for both protocols)."),
        option("model", str, REQUIRED, "--model", "-m", help="Model name on the server."),
        option("protocol", str, "http", "--protocol", help="http or grpc."),
        option("grpc_url", str | None, None, "--grpc-url", help="host:port of the gRPC endpoint (default: the URL's "
               "host, port 8001)."),
        option("binary", bool, True, "--binary/--no-binary", help="HTTP: send and receive tensors with the binary "
               "tensor extension (the default, as Triton's perf_analyzer does) or, with --no-binary, as JSON, which "
               "measures JSON encoding more than the model for large outputs (gRPC is always binary)."),
        option("timeout", float, 30.0, "--timeout", help="Seconds before a request counts as failed."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        return SimpleNamespace(**{**vars(v), "url": v.url if "://" in v.url else f"http://{v.url}",
                                  "protocol": v.protocol.lower()})


class LoadArgs(Group):
    """The load: --concurrency levels (checked), --duration and --warmup per level, --shape-mix, --images,
    --workers, --max-requests, and the --report file."""

    PARAMS = (
        option("concurrency", str, "1,8,32", "--concurrency", "-c", help="Comma-separated outstanding-request "
               "counts, e.g. 1,8,32."),
        option("duration", float, 10.0, "--duration", "-d", help="Measured seconds per level."),
        option("warmup", float, 2.0, "--warmup", help="Unmeasured seconds before each level."),
        option("shape_mix", str | None, None, "--shape-mix", help="Mixed-length requests: DIM=SIZE,SIZE,... (e.g. "
               "sequence=20,50,100,200); requests cycle through the sizes, each set on every dynamic axis but the "
               "batch axis of the inputs --shape does not give. To compare a server with --shape-buckets against "
               "one without."),
        option("images", Path | None, None, "--images", help="A folder of .jpg/.png files: send them as encoded "
               "images (BYTES, one file per row, --batch files per request) round robin, to a server that decodes "
               "them (onnxaccel serve, a KServe/Triton image pipeline); reports images/s."),
        option("workers", int, 0, "--workers", help="Client processes (0: automatic)."),
        option("max_requests", int | None, None, "--max-requests", help="Stop a level after this many requests."),
        option("report", Path | None, None, "--report", help="Write the JSON report here."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        try:
            levels = tuple(int(c) for c in v.concurrency.split(",") if c.strip())
        except ValueError:
            raise UsageError(f"--concurrency must be comma-separated integers, got '{v.concurrency}'.",
                             "e.g. --concurrency 1,8,32") from None
        return SimpleNamespace(**{**vars(v), "concurrency": levels})


def register(app: typer.Typer) -> None:
    """Add the ``loadtest`` command to the application."""
    app.command("loadtest", help="Load-test a running Open Inference Protocol server (onnxaccel serve, Triton, "
                "KServe): throughput and p50/p90/p95/p99 latency per concurrency level, like perf_analyzer.")(
        loadtest_command)


@handle_errors
@composed(
    LoadArgs(), EndpointArgs(),
    ShapeArgs(batch=option("batch", int, 1, "--batch", "-b", help="Rows per request (the batch axis).")),
    OutputArgs(), order=ORDER,
)
def loadtest_command(load, server, shapes, as_json) -> None:
    """Load-test a running inference server at each concurrency level and print or write the report."""
    from onnxaccel.loadtest import LoadtestConfig, run_loadtest  # heavy (asyncio, multiprocessing): per command

    config = LoadtestConfig(
        url=server.url, model=server.model, protocol=server.protocol, binary=server.binary,
        concurrency=load.concurrency, duration_s=load.duration, warmup_s=load.warmup, batch=shapes.batch,
        shapes=shapes.shapes, workers=load.workers, max_requests=load.max_requests, timeout_s=server.timeout,
        grpc_url=server.grpc_url, shape_mix=load.shape_mix, images=str(load.images) if load.images else None,
    )
    report = load.report

    def progress(level) -> None:
        if not as_json:
            rate = f", {level.inferences_per_s:,.1f} images/s" if level.images else ""
            err_console.print(f"[dim]concurrency {level.concurrency}: {level.throughput:,.1f} req/s{rate}[/]")

    result = run_loadtest(config, progress)
    data = result.to_dict()
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(data, indent=2))
    if as_json:
        print_json(data)
        return
    _render(result, report)


def _render(result, report: Path | None) -> None:
    cfg = result.config
    shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in result.input_shapes.items())
    if cfg.shape_mix:
        shapes = f"{shapes} (first of the mix {cfg.shape_mix})"
    if cfg.images:
        shapes = f"encoded images from {cfg.images} ({shapes} per request)"
    transport = cfg.protocol + (" binary" if cfg.binary and cfg.protocol == "http" else
                                " JSON" if cfg.protocol == "http" else "")
    server = result.server.get("name", "?") + " " + result.server.get("version", "")
    console.print(f"[bold]{escape(cfg.model)}[/] on {escape(cfg.url)} ({escape(server.strip())}), {transport}, "
                  f"inputs {shapes}, {cfg.duration_s:g} s per level")
    rows = "images/s" if cfg.images else "infer/s"
    table = columns(new_table("latency in ms; server: mean queue / run per request"),
                    ("conc", "reqs", "errors", "req/s", rows, "p50", "p90", "p95", "p99", "server"),
                    numbers=("conc", "reqs", "req/s", rows, "p50", "p90", "p95", "p99", "server"))
    for level in result.levels:
        lat = level.latency
        fmt = (lambda v: "-" if v is None else f"{v:.4g}")  # 4 significant digits: fits 80 columns
        errors = ", ".join(f"{k}:{v}" for k, v in level.errors.items()) or "0"
        server_times = "-" if level.server_queue_ms is None else \
            f"{level.server_queue_ms:.3g}/{level.server_compute_ms:.3g}"
        table.add_row(str(level.concurrency), si(level.requests), errors, si(level.throughput),
                      si(level.inferences_per_s), fmt(lat and lat.p50), fmt(lat and lat.p90),
                      fmt(lat and lat.p95), fmt(lat and lat.p99), server_times)
    console.print(table)
    if report is not None:
        console.print(f"report written to {report}")
