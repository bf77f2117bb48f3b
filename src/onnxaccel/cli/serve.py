"""`onnxaccel serve`: serve a model or a repository of models over the Open Inference Protocol."""

from __future__ import annotations

import dataclasses
import json
import sys

import typer
from rich.markup import escape

from onnxaccel import startup
from onnxaccel.cli.args_data import OutputArgs, PreprocessArgs
from onnxaccel.cli.args_model import ConfigArgs, ShapeArgs, SourceArg, TargetArgs
from onnxaccel.cli.args_serve import BatcherArgs, LayoutArgs, RayArgs, ServerArgs, SessionArgs
from onnxaccel.cli.common import console, handle_errors, note, print_json, warn
from onnxaccel.cli.compose import composed
from onnxaccel.cli.groups import configured, instance_count
from onnxaccel.errors import UsageError

#: The order of the options in --help.
ORDER = ("source target precision ep_option config shape shape_buckets allow_unavailable host http_port "
         "grpc_port grpc max_batch max_queue_delay_ms queue_delay max_padding warm_all_sizes instances streams "
         "workers shared_models preprocess embed_preprocess max_queue timeout_ms max_request_mb max_connections "
         "drain_timeout arena_strategy arena_limit arena_shrinkage session_per_batch_size strict_readiness "
         "log_level gil_switch_ms gpu_wait direct_copy header_timeout body_timeout body_deadline keep_alive "
         "max_inflight_mb max_json_mb auth_token_file auth_metrics tls_cert tls_key tls_client_ca "
         "model_control shared_memory ray replicas min_replicas as_json")


def register(app: typer.Typer) -> None:
    """Add `serve` to the `onnxaccel` app."""
    app.command("serve", help="Serve a model (.onnx, zoo:NAME) or a folder of models over the Open Inference "
                "Protocol (KServe v2) on HTTP and gRPC, with dynamic batching, Prometheus /metrics and a graceful "
                "drain on SIGTERM. tritonclient, perf_analyzer and the KServe SDK work unchanged.")(serve_command)


@handle_errors
@composed(
    SourceArg("An .onnx file, zoo:NAME, or a folder of models (NAME/model.onnx + optional NAME/config.json; see "
              "docs/SERVING.md).", name="source", metavar="MODEL|REPO_DIR"),
    TargetArgs(config=True, help="Default target of every model (a model's config.json overrides it): cpu, cuda:0, "
               "migraphx:0/fp16?..., or auto. Default: auto, or the --config's target."),
    ConfigArgs("target, shapes and instance count apply to every model (a model's config.json still overrides "
               "them)"),
    ShapeArgs(batch=None, buckets="Sizes the model's symbolic dims are padded up to, e.g. sequence=32,64,128,256 or "
              "height,width=320,480,640: each bucket is compiled and warmed at load, a request runs in the smallest "
              "bucket that fits (batched with requests of that bucket) and its outputs are cropped back; a request "
              "that fits none gets 400. Without it, requests run at their own shapes. A model's config.json key "
              "shape_buckets overrides it."),
    ServerArgs(), BatcherArgs(), LayoutArgs(),
    PreprocessArgs("Image preset (imagenet, yolo, scale01, none) for requests that send encoded images (BYTES, one "
                   "JPEG/PNG per row) to a model taking float [N,3,H,W]; default: the model's metadata, and a model "
                   "whose metadata names none takes no encoded images. Models with embedded preprocessing use "
                   "theirs. A model's config.json key preprocess overrides it. On GPU targets imagenet, yolo and "
                   "scale01 are embedded in the graph (see --embed-preprocess).", check=True,
                   embed=("auto: on a GPU target, a float NCHW image model given --preprocess imagenet|yolo|scale01 "
                          "is served with it embedded (it takes uint8 [N,H,W,3] pixels or JPEG/PNG bytes; cast, "
                          "scale, mean/std and transpose run on the device). none: serve the model as it is (float "
                          "tensors).", "auto")),
    SessionArgs(), RayArgs(), OutputArgs(), order=ORDER,
)
def serve_command(source, target, tuned, shapes, server, batcher, flags, preprocess, session, ray, as_json) -> None:
    """Serve SOURCE until SIGTERM; options a --config can set resolve as flag > config > default (cli/groups.py);
    a model's own config.json in a repository then overrides the result for that model."""
    with startup.stage("import", detail="the command's modules (onnx, numpy)"):  # deferred from start-up
        from onnxaccel.serve.launch import serve  # heavy (asyncio, ssl) and Ray below: loaded per command

    defaults, plan = _model_defaults(target, tuned, shapes, batcher, flags, preprocess, session, ray.ray is not None)
    config = dataclasses.replace(server, workers=plan.workers, shared_models=plan.shared_models,
                                 gil_switch_ms=flags.gil_switch_ms, gpu_wait=flags.gpu_wait,
                                 direct_copy=flags.direct_copy)
    on_ready = _announce(source, plan, as_json)
    if ray.ray is not None and (config.workers > 1 or config.shared_models):
        raise UsageError("--workers runs several local server processes; with --ray, Ray Serve runs the replicas.",
                         "Drop --workers and use --replicas (or autoscaling) with --ray.")
    if ray.ray is not None and config.tls_cert:
        raise UsageError("--tls-cert with --ray: Ray Serve's HTTP proxy, not this server, holds the port.",
                         "Terminate TLS in front of the Ray cluster (a proxy or ingress), or serve without --ray.")
    if ray.ray is not None:
        from onnxaccel.scale.serve_ray import run as serve_on_ray

        result = serve_on_ray(source, defaults, config, on_ready, address=ray.ray, replicas=ray.replicas,
                              min_replicas=ray.min_replicas)
    else:
        result = serve(source, defaults, config, on_ready)
    if as_json:
        print_json({"event": "stopped", **result.to_dict()})
    elif not result.drained:
        warn("some requests were still running when the drain timeout passed.")


def _model_defaults(target, tuned, shapes, batcher, flags, preprocess, session, on_ray: bool):
    """What every model gets unless its config.json says otherwise, and the server's ExecutionPlan (plan.py: the
    process layout and graph capture, decided from the target, the cores and the flags given)."""
    from onnxaccel.plan import Host, PlanRequest, plan_execution
    from onnxaccel.serve.config import model_defaults

    instances = batcher.instances
    if instances is None and configured(tuned, "instances") is not None:
        instances = instance_count(None, tuned)
    plan = plan_execution(target, PlanRequest(
        command="serve", max_batch=batcher.max_batch, max_padding=batcher.max_padding, instances=instances,
        warm_all_sizes=batcher.warm_all_sizes,
        workers=flags.workers, shared_models=flags.shared_models, on_ray=on_ray,
        session_per_batch_size=session.get("session_per_batch_size", True), preprocess=preprocess.preset,
        embed_preprocess=_embed_mode(preprocess.embed), gpu_wait=flags.gpu_wait, gil_switch_ms=flags.gil_switch_ms,
        queue_delay=batcher.queue_delay, streams=batcher.streams),
        host=Host.here())
    served = target.with_options({plan.graph_option: "1"}) if plan.graph_capture else target
    defaults = model_defaults({
        "target": served, "max_batch": batcher.max_batch,
        "max_queue_delay_ms": batcher.max_queue_delay_ms, "queue_delay": plan.queue_delay,
        "max_padding": batcher.max_padding,
        "warm_all_sizes": batcher.warm_all_sizes,
        "instances": plan.instances, "streams": plan.streams, "max_queue": batcher.max_queue,
        "timeout_ms": batcher.timeout_ms, "shapes": {k: list(v) for k, v in shapes.shapes.items()}, **session,
        "shape_buckets": shapes.buckets or None, "preprocess": preprocess.preset,
        "embed_preprocess": _embed_mode(preprocess.embed),
    })
    return defaults, plan


def _announce(source: str, plan, as_json: bool):
    """The callback that says the server is ready: a JSON line (with the plan), or the URLs, what runs (the
    plan's block) and each model's state."""

    def on_ready(server) -> None:
        result = server.result()
        if as_json:
            ready = {"event": "ready", **result.to_dict(), "plan": plan.to_dict()}
            layout = plan.choice("layout")
            if layout is not None:
                ready["layout"] = f"{layout.value} ({layout.reason})"
            sys.stdout.write(json.dumps(ready) + "\n")
            sys.stdout.flush()
            return
        for line in plan.lines():
            note(f"plan: {line}")
        for message in result.warnings:
            note(message)
        console.print(f"[bold]serving[/] {escape(source)} at {result.http_url}"
                      + (f" and grpc://{result.grpc_address}" if result.grpc_address else "")
                      + (f" with {result.workers} worker processes" if result.workers > 1 else "")
                      + (" and one model process" if plan.shared_models else ""))
        for model in result.models:
            state = "[green]READY[/]" if model["state"] == "READY" else f"[red]{model['state']}[/]"
            reason = f": {escape(model.get('reason', ''))}" if model.get("reason") else ""
            console.print(f"  {escape(model['name'])} {state}{reason}")
        if result.startup:
            from onnxaccel.startup import Startup

            note(Startup.from_dict(result.startup).line())
        console.print("[dim]SIGTERM or Ctrl+C drains in-flight requests and stops.[/]")

    return on_ready


def _embed_mode(mode: str) -> str:
    from onnxaccel.serve.config import EMBED_MODES

    if mode.lower() not in EMBED_MODES:
        raise UsageError(f"--embed-preprocess {mode}: not a mode.", "Use auto (embed the --preprocess preset on "
                         "GPU targets) or none (serve the model as it is).")
    return mode.lower()


