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
from onnxaccel.cli.groups import ModelArgs, build_target, config_option, configured, instance_count, load_tuned
from onnxaccel.engines.buckets import ShapeBuckets
from onnxaccel.engines.pool import GPU_WAIT_MODES as GPU_WAIT
from onnxaccel.errors import UsageError
from onnxaccel.serve.config import ServerConfig
from onnxaccel.serve.security import LOOPBACK_HOSTS, TOKEN_ENV, check_tls_files, read_token

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
    shape_buckets: Annotated[str | None, typer.Option("--shape-buckets", help="Sizes the model's symbolic dims "
                             "are padded up to, e.g. sequence=32,64,128,256 or height,width=320,480,640: each "
                             "bucket is compiled and warmed at load, a request runs in the smallest bucket that "
                             "fits (batched with requests of that bucket) and its outputs are cropped back; a "
                             "request that fits none gets 400. Without it, requests run at their own shapes. A "
                             "model's config.json key shape_buckets overrides it.")] = None,
    allow_unavailable: Annotated[bool, typer.Option("--allow-unavailable", help="Keep serving when no model "
                                 "could be loaded (they answer 503 until loaded through the repository API, which needs "
                                 "--model-control explicit); "
                                 "by default such a server stops with the reasons.")] = False,
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
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Server processes sharing the ports, "
                       "each with its own copy of every model (N x its memory). For high request rates with large "
                       "tensors, where one process's request decoding is the limit; see docs/SERVING.md. Default: "
                       "1 on CPU targets; on GPU targets chosen from the cores (with --shared-models and "
                       "--instances, printed at start) unless any of the three is given.")] = None,
    shared_models: Annotated[bool | None, typer.Option("--shared-models/--no-shared-models", help="With "
                             "--workers: the workers only decode "
                             "requests; one model process holds one copy of every model and batches all the "
                             "workers' requests together (fuller batches, one GPU context; API load/unload "
                             "works). Tensors pass through shared memory.")] = None,
    preprocess: Annotated[str | None, typer.Option("--preprocess", help="Image preset (imagenet, yolo, scale01, "
                          "none) for requests that send encoded images (BYTES, one JPEG/PNG per row) to a model "
                          "taking float [N,3,H,W]; default: the model's metadata, and a model whose metadata names "
                          "none takes no encoded images. Models with embedded preprocessing use theirs. A model's "
                          "config.json key preprocess overrides it. On GPU targets imagenet, yolo and scale01 are "
                          "embedded in the graph (see --embed-preprocess).")] = None,
    embed_preprocess: Annotated[str, typer.Option("--embed-preprocess", help="auto: on a GPU target, a float NCHW "
                                "image model given --preprocess imagenet|yolo|scale01 is served with it embedded "
                                "(it takes uint8 [N,H,W,3] pixels or JPEG/PNG bytes; cast, scale, mean/std and "
                                "transpose run on the device). none: serve the model as it is (float tensors).")
                                ] = "auto",
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
    header_timeout: Annotated[float, typer.Option("--header-timeout", min=0.1, help="Seconds a request's line "
                              "and headers may take; then 408 and the connection is closed (slow clients cannot "
                              "hold connections).")] = 10.0,
    body_timeout: Annotated[float, typer.Option("--body-timeout", min=0.1, help="Seconds allowed between two "
                            "reads of a request body; then 408 and close.")] = 30.0,
    keep_alive: Annotated[float, typer.Option("--keep-alive", min=0.1, help="Seconds an idle keep-alive "
                          "connection stays open.")] = 30.0,
    max_inflight_mb: Annotated[float, typer.Option("--max-inflight-mb", help="Request-body MB all connections "
                               "together may hold; a body that would pass it gets 503 + Retry-After before it is "
                               "read (at least --max-request-mb).")] = 256.0,
    max_json_mb: Annotated[float, typer.Option("--max-json-mb", help="Largest JSON part of an inference "
                           "request (parsed JSON takes ~10x its text); larger gets 413: send big tensors as "
                           "binary data.")] = 16.0,
    auth_token_file: Annotated[str | None, typer.Option("--auth-token-file", help="File holding a bearer token "
                               f"every route but health needs (HTTP 'Authorization: Bearer TOKEN', gRPC metadata "
                               f"'authorization'); or set {TOKEN_ENV}.")] = None,
    auth_metrics: Annotated[bool, typer.Option("--auth-metrics", help="Require the token for /metrics too.")
                            ] = False,
    tls_cert: Annotated[str | None, typer.Option("--tls-cert", help="PEM certificate chain: serve HTTPS and "
                        "gRPC over TLS (with --tls-key).")] = None,
    tls_key: Annotated[str | None, typer.Option("--tls-key", help="PEM private key of --tls-cert.")] = None,
    tls_client_ca: Annotated[str | None, typer.Option("--tls-client-ca", help="PEM CA: clients must present a "
                             "certificate it signed (mutual TLS).")] = None,
    model_control: Annotated[str, typer.Option("--model-control", help="Repository load/unload through the API: "
                             "none (refused with 403) or explicit (as Triton's --model-control-mode). The index "
                             "stays readable.")] = "none",
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
    layout = _layout(tgt, workers, shared_models, instance_count(instances, tuned) if instances is not None
                     or configured(tuned, "instances") is not None else None, ray is not None)
    workers, shared_models = layout.workers, layout.shared_models
    shapes = ModelArgs.resolve(source, shape=shape, batch=None, tuned=tuned).shapes
    buckets_text = _buckets_text(shape_buckets or getattr(tuned, "shape_buckets", None))
    defaults = {
        "target": layout.target or str(tgt), "max_batch": max_batch, "max_queue_delay_ms": max_queue_delay_ms,
        "max_padding": max_padding,
        "instances": layout.instances or instance_count(instances, tuned), "max_queue": max_queue, "timeout_ms": timeout_ms,
        "shapes": {k: list(v) for k, v in shapes.items()},
        "arena_extend_strategy": arena_extend_strategy, "gpu_mem_limit": gpu_mem_limit,
        "arena_shrinkage": arena_shrinkage, "session_per_batch_size": session_per_batch_size,
        "shape_buckets": buckets_text or None, "preprocess": _preprocess(preprocess),
        "embed_preprocess": _embed_mode(embed_preprocess),
    }
    server_config = ServerConfig(
        host=host, http_port=http_port, grpc_port=grpc_port if grpc else None,
        max_request_bytes=int(max_request_mb * 1024 * 1024), max_connections=max_connections,
        drain_timeout_s=drain_timeout, strict_readiness=strict_readiness, log_level=log_level, workers=workers,
        gil_switch_ms=gil_switch_ms, gpu_wait=_gpu_wait(gpu_wait), shared_models=shared_models,
        direct_copy=direct_copy, allow_unavailable=allow_unavailable,
        header_timeout_s=header_timeout, body_timeout_s=body_timeout, keep_alive_s=keep_alive,
        max_inflight_bytes=int(max_inflight_mb * 1024 * 1024), max_json_bytes=int(max_json_mb * 1024 * 1024),
        auth_token=read_token(auth_token_file), auth_metrics=auth_metrics, tls_cert=tls_cert, tls_key=tls_key,
        tls_client_ca=tls_client_ca, model_control=_model_control(model_control),
    )
    check_tls_files(tls_cert, tls_key, tls_client_ca)
    if host not in LOOPBACK_HOSTS and not server_config.auth_token:
        warn(f"listening on {host} without a token: anyone who reaches this address can use the server. Add one "
             f"with --auth-token-file FILE (e.g. `openssl rand -hex 32 > FILE`) or the {TOKEN_ENV} environment "
             "variable, and --tls-cert/--tls-key for TLS; see docs/SECURITY.md.")

    def on_ready(server) -> None:
        result = server.result()
        if as_json:
            ready = {"event": "ready", **result.to_dict()}
            if layout.automatic:
                ready["layout"] = layout.describe()
            sys.stdout.write(json.dumps(ready) + "\n")
            sys.stdout.flush()
            return
        if layout.automatic:
            note(layout.describe())
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
    if ray is not None and tls_cert:
        raise UsageError("--tls-cert with --ray: Ray Serve's HTTP proxy, not this server, holds the port.",
                         "Terminate TLS in front of the Ray cluster (a proxy or ingress), or serve without --ray.")
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


def _buckets_text(value) -> str | None:
    """--shape-buckets (or the --config's shape_buckets, text or ShapeBuckets) as canonical text; a bad value
    stops here, before any model loads."""
    if not value:
        return None
    buckets = value if isinstance(value, ShapeBuckets) else ShapeBuckets.parse(str(value))
    return buckets.describe()


def _layout(target, workers: int | None, shared_models: bool | None, instances: int | None, on_ray: bool):
    """The process layout: the flags as given (defaults 1 worker, no shared models), or on a GPU target with no
    layout flag (and not on Ray) the one serve/layout.py chooses from the cores."""
    import os

    from onnxaccel.serve.layout import ServeLayout, choose_layout, layout_flags_given

    if on_ray or layout_flags_given(workers, shared_models, instances):
        return ServeLayout(workers=workers or 1, shared_models=bool(shared_models), instances=instances)
    return choose_layout(os.cpu_count() or 1, target)


def _preprocess(preset: str | None) -> str | None:
    from onnxaccel.inputs_files import PRESETS

    if preset is not None and preset not in PRESETS:
        raise UsageError(f"--preprocess {preset}: not an image preset.", f"Use one of {', '.join(PRESETS)}.")
    return preset


def _embed_mode(mode: str) -> str:
    from onnxaccel.serve.config import EMBED_MODES

    if mode.lower() not in EMBED_MODES:
        raise UsageError(f"--embed-preprocess {mode}: not a mode.", "Use auto (embed the --preprocess preset on "
                         "GPU targets) or none (serve the model as it is).")
    return mode.lower()


def _model_control(mode: str) -> str:
    mode = mode.lower()
    if mode not in ("none", "explicit"):
        raise UsageError(f"--model-control {mode}: not a mode.", "Use none (default: no load/unload through the "
                         "API) or explicit.")
    return mode


def _gpu_wait(mode: str) -> str:
    mode = mode.lower()
    if mode not in GPU_WAIT:
        raise UsageError(f"--gpu-wait {mode}: not a wait mode.", f"Use one of: {', '.join(GPU_WAIT)}.")
    return mode
