"""Argument groups of `serve`: the server (address, ports, limits, TLS, auth), the dynamic batcher, the
process layout, the sessions' memory and Ray Serve."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

from onnxaccel.cli.common import warn
from onnxaccel.cli.compose import Built, Group, option
from onnxaccel.errors import UsageError
from onnxaccel.serve.auth import LOOPBACK_HOSTS, TOKEN_ENV, check_tls_files, read_token

if TYPE_CHECKING:  # the server and the engines are imported when the command runs
    from onnxaccel.serve.config import ServerConfig

MB = 1024 * 1024


class ServerArgs(Group):
    """Where the server listens, its limits, auth and TLS; builds a ``ServerConfig`` (the process layout left
    at its defaults: see :class:`LayoutArgs`). Checks the TLS files and warns about an exposed address
    without a token."""

    PARAMS = (
        option("allow_unavailable", bool, False, "--allow-unavailable", help="Keep serving when no model could be "
               "loaded (they answer 503 until loaded through the repository API, which needs --model-control "
               "explicit); by default such a server stops with the reasons."),
        option("host", str, "127.0.0.1", help="Address to listen on. 127.0.0.1 keeps the server private; 0.0.0.0 "
               "exposes it to the network."),
        option("http_port", int, 8000, "--http-port", help="HTTP port (0: any free port)."),
        option("grpc_port", int, 8001, "--grpc-port", help="gRPC port (0: any free port)."),
        option("grpc", bool, True, "--grpc/--no-grpc", help="Serve gRPC too."),
        option("max_request_mb", float, 64.0, "--max-request-mb", help="Largest request body/message; larger gets "
               "413 (HTTP) or RESOURCE_EXHAUSTED (gRPC)."),
        option("max_connections", int, 1024, "--max-connections", help="Concurrent HTTP connections before 503 "
               "(bounds memory with --max-request-mb)."),
        option("drain_timeout", float, 30.0, "--drain-timeout", help="Seconds SIGTERM waits for in-flight "
               "requests."),
        option("strict_readiness", bool, False, "--strict-readiness", help="Ready only when every model loaded "
               "(default: when at least one did)."),
        option("log_level", str, "warning", "--log-level", help="uvicorn's log level, and onnxaccel's messages on "
               "stderr at info or debug (a model loaded, a padded batch size warm and in use)."),
        option("header_timeout", float, 10.0, "--header-timeout", min=0.1, help="Seconds a request's line and "
               "headers may take; then 408 and the connection is closed (slow clients cannot hold connections)."),
        option("body_timeout", float, 30.0, "--body-timeout", min=0.1, help="Seconds allowed between two reads of "
               "a request body; then 408 and close."),
        option("body_deadline", float, 300.0, "--body-deadline", min=0.1, help="Seconds a whole request body may "
               "take; then 408 and close (a body trickled slowly cannot hold a connection for ever)."),
        option("keep_alive", float, 30.0, "--keep-alive", min=0.1, help="Seconds an idle keep-alive connection "
               "stays open."),
        option("max_inflight_mb", float, 256.0, "--max-inflight-mb", help="Request-body MB all connections "
               "together may hold; a body that would pass it gets 503 + Retry-After before it is read (at least "
               "--max-request-mb)."),
        option("max_json_mb", float, 16.0, "--max-json-mb", help="Largest JSON part of an inference request "
               "(parsed JSON takes ~10x its text); larger gets 413: send big tensors as binary data."),
        option("auth_token_file", str | None, None, "--auth-token-file", help="File holding a bearer token every "
               "route but health needs (HTTP 'Authorization: Bearer TOKEN', gRPC metadata 'authorization'); or set "
               f"{TOKEN_ENV}."),
        option("auth_metrics", bool, False, "--auth-metrics", help="Require the token for /metrics too."),
        option("tls_cert", str | None, None, "--tls-cert", help="PEM certificate chain: serve HTTPS and gRPC over "
               "TLS (with --tls-key)."),
        option("tls_key", str | None, None, "--tls-key", help="PEM private key of --tls-cert."),
        option("tls_client_ca", str | None, None, "--tls-client-ca", help="PEM CA: clients must present a "
               "certificate it signed (mutual TLS)."),
        option("model_control", str, "none", "--model-control", help="Repository load/unload through the API: "
               "none (refused with 403) or explicit (as Triton's --model-control-mode). The index stays readable."),
        option("shared_memory", str | None, None, "--shared-memory", help="Triton's system shared memory "
               "extension: none (default, refused, as Triton since its --allow-client-shm change) or system (clients "
               "on this machine register /dev/shm objects of their own user and pass tensors through them, each "
               "seeing only its user's regions: tritonclient.utils.shared_memory, perf_analyzer --shared-memory "
               "system). CUDA shared memory is not offered. See docs/SECURITY.md."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> ServerConfig:
        """The object the class docstring names, from the options' values."""
        from onnxaccel.serve.config import ServerConfig

        config = ServerConfig(
            host=v.host, http_port=v.http_port, grpc_port=v.grpc_port if v.grpc else None,
            max_request_bytes=int(v.max_request_mb * MB), max_connections=v.max_connections,
            drain_timeout_s=v.drain_timeout, strict_readiness=v.strict_readiness, log_level=v.log_level,
            allow_unavailable=v.allow_unavailable, header_timeout_s=v.header_timeout, body_timeout_s=v.body_timeout,
            body_deadline_s=v.body_deadline,
            keep_alive_s=v.keep_alive, max_inflight_bytes=int(v.max_inflight_mb * MB),
            max_json_bytes=int(v.max_json_mb * MB), auth_token=read_token(v.auth_token_file),
            auth_metrics=v.auth_metrics, tls_cert=v.tls_cert, tls_key=v.tls_key, tls_client_ca=v.tls_client_ca,
            model_control=_model_control(v.model_control), shared_memory=_shared_memory(v.shared_memory, ctx),
        )
        check_tls_files(v.tls_cert, v.tls_key, v.tls_client_ca)
        if v.host not in LOOPBACK_HOSTS and not config.auth_token:
            shm = (" System shared memory stays with clients on this host (a remote client is refused it)."
                   if config.shared_memory == "system" else "")
            warn(f"listening on {v.host} without a token: anyone who reaches this address can use the server. Add "
                 f"one with --auth-token-file FILE (e.g. `openssl rand -hex 32 > FILE`) or the {TOKEN_ENV} "
                 f"environment variable, and --tls-cert/--tls-key for TLS; see docs/SECURITY.md.{shm}")
        return config


def _shared_memory(mode: str | None, ctx: Built) -> str:
    """--shared-memory, checked: none unless given (Triton turned client shared memory off by default in
    triton-inference-server/server#8739, 2026-04: a client names the server user's /dev/shm objects); never on Ray
    (its replicas may run on other machines)."""
    on_ray = _given(ctx, "ray") is not None
    if mode is None:
        return "none"
    mode = mode.lower()
    if mode not in ("system", "none"):
        hint = " CUDA shared memory is not offered." if mode == "cuda" else ""
        raise UsageError(f"--shared-memory {mode}: not a mode.{hint}", "Use system (Triton's system shared memory "
                         "extension) or none (the default).")
    if mode == "system" and on_ray:
        raise UsageError("--shared-memory system with --ray: Ray Serve's replicas may run on other machines, which "
                         "cannot map this machine's shared memory.", "Drop --shared-memory, or serve without --ray.")
    return mode


def _given(ctx: Built, name: str):
    """The command line's value of ``name``, or None when the command has no such option."""
    try:
        return ctx.given(name)
    except KeyError:
        return None


def _model_control(mode: str) -> str:
    mode = mode.lower()
    if mode not in ("none", "explicit"):
        raise UsageError(f"--model-control {mode}: not a mode.", "Use none (default: no load/unload through the "
                         "API) or explicit.")
    return mode


class BatcherArgs(Group):
    """Each model's dynamic batcher and queue: --max-batch, --max-queue-delay-ms, --queue-delay, --max-padding,
    --warm-all-sizes, --instances (None unless given), --streams, --max-queue, --timeout-ms. Builds their values."""

    PARAMS = (
        option("max_batch", int, 8, "--max-batch", help="Largest dynamic batch; 1 turns batching off."),
        option("max_queue_delay_ms", float, 2.0, "--max-queue-delay-ms", help="How long the first request of a "
               "batch waits for others."),
        option("queue_delay", str | None, None, "--queue-delay", help="adaptive: a batch waits for others only "
               "while more HTTP requests are on their way into this process (their bodies still arriving; none: it "
               "runs with what is queued); fixed: it always waits --max-queue-delay-ms, as Triton; fill: adaptive, and "
               "with several instances a batch that is not full also waits while another instance's batch runs "
               "(until it is full or none runs), while enough requests are about (twice --max-batch) to fill it. "
               "Default: fill on a GPU target with several instances, else adaptive (the plan's queue_delay line "
               "says which)."),
        option("max_padding", float, 0.25, "--max-padding", min=0.0, max=1.0, help="GPUs (batches padded to "
               "powers of two): the largest share of a batch that may be padding; above it the batch is cut to the "
               "size below and the rest wait for the next one. 1 never cuts."),
        option("warm_all_sizes", bool, False, "--warm-all-sizes", help="GPUs: warm every padded batch size before "
               "ready (default: the largest, which every batch fits; the others warm in the background)."),
        option("instances", int | None, None, "--instances", min=1, help="Sessions per model running batches in "
               "parallel (default 1, or the count in --config)."),
        option("streams", str | None, None, "--streams", help="Several instances on a GPU: shared (one device "
               "stream for all: their runs queue on the GPU in launch order, the next launched while the last runs), "
               "serial (a stream each, one run at a time; any provider) or own (a stream each: their runs go side "
               "by side). Default: own (the plan's streams line)."),
        option("max_queue", int, 256, "--max-queue", help="Requests waiting per model before 429."),
        option("timeout_ms", float, 30000.0, "--timeout-ms", help="Per-request deadline (queue + run), 0 for none; "
               "past it the request gets 503."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        from onnxaccel.serve.config import STREAMS

        if v.streams is not None and v.streams not in STREAMS:
            raise UsageError(f"--streams {v.streams}: not a stream mode.",
                             "Use --streams shared (the instances' runs queue on one device stream), serial (one "
                             "run at a time) or own.")
        return v


class LayoutArgs(Group):
    """The server's processes and threads: --workers, --shared-models (None unless given), --gil-switch-ms,
    --gpu-wait (checked), --direct-copy. Builds their values."""

    PARAMS = (
        option("workers", int | None, None, "--workers", min=1, help="Server processes sharing the ports, each with "
               "its own copy of every model (N x its memory). For high request rates with large tensors, where one "
               "process's request decoding is the limit; see docs/SERVING.md. Default: 1 on CPU targets; on GPU "
               "targets chosen from the cores (with --shared-models and --instances, printed at start) unless any "
               "of the three is given."),
        option("shared_models", bool | None, None, "--shared-models/--no-shared-models", help="With --workers: the "
               "workers only decode requests; one model process holds one copy of every model and batches all the "
               "workers' requests together (fuller batches, one GPU context; API load/unload works). Tensors pass "
               "through shared memory."),
        option("gil_switch_ms", float, 0.5, "--gil-switch-ms", min=0.0, help="Python's GIL switch interval in the "
               "server, ms (0: Python's default, 5). Short waits for the run threads while the event loop decodes "
               "requests."),
        option("gpu_wait", str, "block", "--gpu-wait", help="How run threads wait for the GPU: block (CUDA: sleep "
               "until the GPU signals; ROCm: poll up to 100 us, then sleep, per the HIP runtime's source, whose API "
               "reference calls it a synonym for yield), spin, yield (ROCm: both an active wait), or auto (the "
               "runtime's default). Blocking leaves cores to the event loops."),
        option("direct_copy", bool, True, "--direct-copy/--no-direct-copy", help="With --shared-models and graph "
               "capture: page-lock the workers' shared memory and copy each request straight to the GPU; "
               "--no-direct-copy joins each batch on the host first."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        from onnxaccel.engines.pool import GPU_WAIT_MODES as GPU_WAIT

        mode = v.gpu_wait.lower()
        if mode not in GPU_WAIT:
            raise UsageError(f"--gpu-wait {mode}: not a wait mode.", f"Use one of: {', '.join(GPU_WAIT)}.")
        return SimpleNamespace(**{**vars(v), "gpu_wait": mode})


class SessionArgs(Group):
    """The sessions' memory: --arena-extend-strategy, --gpu-mem-limit, --arena-shrinkage, --session-per-batch-size.
    Builds them as the per-model defaults' keys (the arena's two under ModelConfig's names; the plan turns them
    into the provider's own option keys, ProviderSpec.arena_keys)."""

    PARAMS = (
        option("arena_strategy", str | None, None, "--arena-extend-strategy", help="GPU arena growth: "
               "kSameAsRequested keeps memory flat over a long run; kNextPowerOfTwo."),
        option("arena_limit", int | None, None, "--gpu-mem-limit", help="GPU arena limit in bytes."),
        option("arena_shrinkage", bool, False, "--arena-shrinkage", help="Shrink memory arenas after every run "
               "(RunOptions memory.enable_memory_arena_shrinkage)."),
        option("session_per_batch_size", bool, True, "--session-per-batch-size/--one-session", help="GPUs: one "
               "session per padded batch size, so no session changes input shape (a shape change rebuilds cuDNN "
               "plans / MIGraphX programs); costs a copy of the weights per size."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> dict:
        """The object the class docstring names, from the options' values."""
        values = dict(vars(v))
        arena = dict(arena_extend_strategy=values.pop("arena_strategy"), gpu_mem_limit=values.pop("arena_limit"))
        return {**values, **arena}


class RayArgs(Group):
    """Serving on Ray Serve: --ray (None: not on Ray), --replicas, --min-replicas."""

    PARAMS = (
        option("ray", str | None, None, "--ray", help="Serve as a Ray Serve deployment: auto (RAY_ADDRESS, a cluster "
               "running here, else a new local one), local, or the cluster's ADDRESS. One replica per GPU, "
               "autoscaling on queued requests; HTTP only."),
        option("replicas", int | None, None, "--replicas", help="With --ray: a fixed replica count (default: "
               "autoscale from --min-replicas up to one per GPU)."),
        option("min_replicas", int, 1, "--min-replicas", help="With --ray: fewest replicas when autoscaling."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        return v
