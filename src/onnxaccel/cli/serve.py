"""`onnxaccel serve`: serve a model or a repository of models over the Open Inference Protocol."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.markup import escape

from onnxaccel.cli.common import (
    EpOptionOpt, JsonOpt, PrecisionOpt, ShapeOpt, console, handle_errors, note, print_json, warn,
)
from onnxaccel.cli.groups import ModelArgs, build_target, config_option, instance_count, load_tuned
from onnxaccel.engines.pool import GPU_WAIT_MODES as GPU_WAIT
from onnxaccel.errors import UsageError
from onnxaccel.serve.config import ServerConfig

ConfigOpt = config_option("target, shapes and instance count apply to every model (a model's config.json still "
                          "overrides them)")


def register(app: typer.Typer) -> None:
    """Add `serve` to the `onnxaccel` app."""
    app.command("serve", help="Serve a model (.onnx, zoo:NAME) or a folder of models over the Open Inference "
                "Protocol (KServe v2) on HTTP and gRPC, with dynamic batching, Prometheus /metrics and a graceful "
                "drain on SIGTERM. tritonclient, perf_analyzer and the KServe SDK work unchanged.")(serve_command)


@handle_errors
def serve_command(
    source: Annotated[str, typer.Argument(metavar="MODEL|REPO_DIR", help="An .onnx file, zoo:NAME, or a folder "
                      "of models (NAME/model.onnx + optional NAME/config.json; see docs/SERVING.md).")],
    target: Annotated[str | None, typer.Option("--target", "-t", help="Default target of every model (a model's "
                      "config.json overrides it): cpu, cuda:0, migraphx:0/fp16?..., or auto. Default: auto, or "
                      "the --config's target.")] = None,
    precision: PrecisionOpt = None,
    ep_option: EpOptionOpt = None,
    config: ConfigOpt = None,
    shape: ShapeOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on. 127.0.0.1 keeps the server private; 0.0.0.0 "
                    "exposes it to the network.")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option("--http-port", help="HTTP port (0: any free port).")] = 8000,
    grpc_port: Annotated[int, typer.Option("--grpc-port", help="gRPC port (0: any free port).")] = 8001,
    grpc: Annotated[bool, typer.Option("--grpc/--no-grpc", help="Serve gRPC too.")] = True,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Largest dynamic batch; 1 turns batching off.")] = 8,
    max_queue_delay_ms: Annotated[float, typer.Option("--max-queue-delay-ms", help="How long the first request "
                                  "of a batch waits for others.")] = 2.0,
    max_padding: Annotated[float, typer.Option("--max-padding", min=0.0, max=1.0, help="GPUs (batches padded to "
                           "powers of two): the largest share of a batch that may be padding; above it the batch "
                           "is cut to the size below and the rest wait for the next one. 1 never cuts.")] = 0.25,
    instances: Annotated[int | None, typer.Option("--instances", min=1, help="Sessions per model running batches "
                         "in parallel (default 1, or the count in --config).")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Server processes sharing the ports, each "
                       "with its own copy of every model (N x its memory). For high request rates with large "
                       "tensors, where one process's request decoding is the limit; see docs/SERVING.md.")] = 1,
    shared_models: Annotated[bool, typer.Option("--shared-models", help="With --workers: the workers only decode "
                             "requests; one model process holds one copy of every model and batches all the "
                             "workers' requests together (fuller batches, one GPU context; API load/unload "
                             "works). Tensors pass through shared memory.")] = False,
    max_queue: Annotated[int, typer.Option("--max-queue", help="Requests waiting per model before 429.")] = 256,
    timeout_ms: Annotated[float, typer.Option("--timeout-ms", help="Per-request deadline (queue + run), "
                          "0 for none; past it the request gets 503.")] = 30000.0,
    max_request_mb: Annotated[float, typer.Option("--max-request-mb", help="Largest request body/message; larger "
                              "gets 413 (HTTP) or RESOURCE_EXHAUSTED (gRPC).")] = 64.0,
    max_connections: Annotated[int, typer.Option("--max-connections", help="Concurrent HTTP connections before "
                               "503 (bounds memory with --max-request-mb).")] = 1024,
    drain_timeout: Annotated[float, typer.Option("--drain-timeout", help="Seconds SIGTERM waits for in-flight "
                             "requests.")] = 30.0,
    arena_extend_strategy: Annotated[str | None, typer.Option("--arena-extend-strategy", help="GPU arena growth: "
                                     "kSameAsRequested keeps memory flat over a long run; kNextPowerOfTwo.")] = None,
    gpu_mem_limit: Annotated[int | None, typer.Option("--gpu-mem-limit", help="GPU arena limit in bytes.")] = None,
    arena_shrinkage: Annotated[bool, typer.Option("--arena-shrinkage", help="Shrink memory arenas after every run "
                               "(RunOptions memory.enable_memory_arena_shrinkage).")] = False,
    session_per_batch_size: Annotated[bool, typer.Option("--session-per-batch-size/--one-session", help="GPUs: "
                                      "one session per padded batch size, so no session changes input shape "
                                      "(a shape change rebuilds cuDNN plans / MIGraphX programs); costs a copy of "
                                      "the weights per size.")] = True,
    strict_readiness: Annotated[bool, typer.Option("--strict-readiness", help="Ready only when every model "
                                "loaded (default: when at least one did).")] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level.")] = "warning",
    gil_switch_ms: Annotated[float, typer.Option("--gil-switch-ms", min=0.0, help="Python's GIL switch interval "
                             "in the server, ms (0: Python's default, 5). Short waits for the run threads while "
                             "the event loop decodes requests.")] = 0.5,
    gpu_wait: Annotated[str, typer.Option("--gpu-wait", help="How run threads wait for the GPU: block (CUDA: "
                        "sleep until the GPU signals; ROCm: poll up to 100 us, then sleep, per the HIP runtime's "
                        "source, whose API reference calls it a synonym for yield), spin, yield (ROCm: both an "
                        "active wait), or auto (the runtime's default). Blocking leaves cores to the event loops.")
                        ] = "block",
    direct_copy: Annotated[bool, typer.Option("--direct-copy/--no-direct-copy", help="With --shared-models and "
                           "graph capture: page-lock the workers' shared memory and copy each request straight to "
                           "the GPU; --no-direct-copy joins each batch on the host first.")] = True,
    ray: Annotated[str | None, typer.Option("--ray", help="Serve as a Ray Serve deployment: auto (RAY_ADDRESS, a "
                   "cluster running here, else a new local one), local, or the cluster's ADDRESS. One replica per GPU, "
                   "autoscaling on queued requests; HTTP only.")] = None,
    replicas: Annotated[int | None, typer.Option("--replicas", help="With --ray: a fixed replica count (default: "
                        "autoscale from --min-replicas up to one per GPU).")] = None,
    min_replicas: Annotated[int, typer.Option("--min-replicas", help="With --ray: fewest replicas when "
                            "autoscaling.")] = 1,
    as_json: JsonOpt = False,
) -> None:
    """Serve SOURCE until SIGTERM; options a --config can set resolve as flag > config > default (cli/groups.py);
    a model's own config.json in a repository then overrides the result for that model."""
    from onnxaccel.serve.launch import serve  # heavy (asyncio, ssl) and Ray below: loaded per command

    tuned = load_tuned(config)
    tgt = build_target(target, precision, ep_option, tuned)
    shapes = ModelArgs.resolve(source, shape=shape, batch=None, tuned=tuned).shapes
    defaults = {
        "target": str(tgt), "max_batch": max_batch, "max_queue_delay_ms": max_queue_delay_ms,
        "max_padding": max_padding,
        "instances": instance_count(instances, tuned), "max_queue": max_queue, "timeout_ms": timeout_ms,
        "shapes": {k: list(v) for k, v in shapes.items()},
        "arena_extend_strategy": arena_extend_strategy, "gpu_mem_limit": gpu_mem_limit,
        "arena_shrinkage": arena_shrinkage, "session_per_batch_size": session_per_batch_size,
    }
    server_config = ServerConfig(
        host=host, http_port=http_port, grpc_port=grpc_port if grpc else None,
        max_request_bytes=int(max_request_mb * 1024 * 1024), max_connections=max_connections,
        drain_timeout_s=drain_timeout, strict_readiness=strict_readiness, log_level=log_level, workers=workers,
        gil_switch_ms=gil_switch_ms, gpu_wait=_gpu_wait(gpu_wait), shared_models=shared_models,
        direct_copy=direct_copy,
    )
    if host not in ("127.0.0.1", "localhost", "::1"):
        warn(f"listening on {host}: the server has no authentication; anyone who reaches this address can use it.")

    def on_ready(server) -> None:
        result = server.result()
        if as_json:
            sys.stdout.write(json.dumps({"event": "ready", **result.to_dict()}) + "\n")
            sys.stdout.flush()
            return
        for message in result.warnings:
            note(message)
        console.print(f"[bold]serving[/] {escape(source)} at {result.http_url}"
                      + (f" and grpc://{result.grpc_address}" if result.grpc_address else "")
                      + (f" with {result.workers} worker processes" if result.workers > 1 else "")
                      + (" and one model process" if shared_models else ""))
        for model in result.models:
            state = "[green]READY[/]" if model["state"] == "READY" else f"[red]{model['state']}[/]"
            reason = f": {escape(model.get('reason', ''))}" if model.get("reason") else ""
            console.print(f"  {escape(model['name'])} {state}{reason}")
        console.print("[dim]SIGTERM or Ctrl+C drains in-flight requests and stops.[/]")

    if ray is not None and (workers > 1 or shared_models):
        raise UsageError("--workers runs several local server processes; with --ray, Ray Serve runs the replicas.",
                         "Drop --workers and use --replicas (or autoscaling) with --ray.")
    if ray is not None:
        from onnxaccel.scale.serve_ray import run as serve_on_ray

        result = serve_on_ray(source, defaults, server_config, on_ready, address=ray, replicas=replicas,
                              min_replicas=min_replicas)
    else:
        result = serve(source, defaults, server_config, on_ready)
    if as_json:
        print_json({"event": "stopped", **result.to_dict()})
    elif not result.drained:
        warn("some requests were still running when the drain timeout passed.")


def _gpu_wait(mode: str) -> str:
    mode = mode.lower()
    if mode not in GPU_WAIT:
        raise UsageError(f"--gpu-wait {mode}: not a wait mode.", f"Use one of: {', '.join(GPU_WAIT)}.")
    return mode
