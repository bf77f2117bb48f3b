"""A perf_analyzer-style load test for any Open Inference Protocol server (onnxaccel, Triton, KServe).

For each concurrency level N, N requests are kept outstanding (each client sends its next request when the
previous one answers) for ``warmup_s`` (not measured) and then ``duration_s``; the report gives throughput
(requests/s and inferences/s = rows/s), client-side latency percentiles, errors by status, and the server's
own queue and compute time when it offers Triton's statistics extension. perf_analyzer's concurrency mode works
the same way (triton-inference-server/perf_analyzer docs/cli.md, --concurrency-range).

Requests are spread over ``workers`` processes (each an asyncio loop), so the generator is not the bottleneck.
Every level is bounded by its duration and, when given, ``max_requests``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from onnxaccel.bench.stats import LatencyStats
from onnxaccel.errors import UsageError
from onnxaccel.loadtest.clients import GrpcCaller, HttpConnection, grpc_payload, http_payload
from onnxaccel.loadtest.results import LevelResult, LoadtestConfig, LoadtestReport
from onnxaccel.loadtest.shapes import request_dims, request_rows, require_bound
from onnxaccel.process_guard import exit_with_parent
from onnxaccel.serve.protocol import DATATYPES


# --- inputs -----------------------------------------------------------------------------------------------

def make_inputs(metadata: dict, batch: int, shapes: dict[str, tuple[int, ...]], seed: int,
                source: str = "MODEL") -> dict[str, np.ndarray]:
    """Random inputs from the model's metadata, shaped as loadtest/shapes.py binds them (--shape INPUT=DIMS or
    DIM=VALUE, ``batch`` on a variable axis 0); ``source`` names the model in errors (``URL --model NAME``)."""
    dims = request_dims(metadata, batch, shapes, source)
    require_bound(metadata, dims, shapes, source)
    return _random_inputs(metadata, {k: [int(d) for d in v] for k, v in dims.items()}, seed)


def _random_inputs(metadata: dict, shapes: dict[str, list[int]], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for tensor in metadata.get("inputs", []):
        name, dims = tensor["name"], shapes[tensor["name"]]
        datatype = tensor["datatype"]
        if datatype not in DATATYPES or datatype == "BYTES":
            raise UsageError(f"Input '{name}' is {datatype}; the load test generates numeric inputs only.",
                             "Load-test a model with numeric inputs.")
        dtype = DATATYPES[datatype]
        if dtype.kind == "f":
            out[name] = rng.random(dims, dtype=np.float32).astype(dtype)
        elif dtype.kind == "b":
            out[name] = rng.random(dims) < 0.5
        elif name.endswith(("attention_mask", "token_type_ids")):  # BERT's layout: values are 0/1 there
            out[name] = (np.ones(dims) if name.endswith("mask") else np.zeros(dims)).astype(dtype)
        else:
            out[name] = rng.integers(0, 100, size=dims).astype(dtype)
    return out


#: The files ``--images`` sends: what servers decode (serve/images.py takes what Pillow reads; these two are
#: what KServe's and Triton's image examples send).
IMAGE_FILES = (".jpg", ".jpeg", ".png")


def image_input_name(metadata: dict) -> str:
    """The input that takes encoded images: the one the model metadata's ``parameters.image_input`` names
    (onnxaccel serve), else the model's only input."""
    advertised = (metadata.get("parameters") or {}).get("image_input")
    if isinstance(advertised, dict) and isinstance(advertised.get("name"), str):
        return advertised["name"]
    inputs = metadata.get("inputs", [])
    if len(inputs) != 1:
        raise UsageError(f"Model '{metadata.get('name', '?')}' has {len(inputs)} inputs and its metadata names no "
                         "image input (parameters.image_input); --images needs one image input.",
                         "Load-test it with tensors (drop --images).")
    return inputs[0]["name"]


def make_image_inputs(metadata: dict, folder: str, batch: int) -> list[dict[str, np.ndarray]]:
    """One input set per ``batch`` files of ``folder`` (sorted, cycled to fill the last): the image input as
    BYTES of shape [batch], one encoded file per row. Requests go round robin through the sets."""
    root = Path(folder)
    if not root.is_dir():
        raise UsageError(f"--images {folder}: not a folder.", "Give a folder of .jpg/.png files.")
    files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_FILES)
    if not files:
        raise UsageError(f"--images {folder}: no .jpg, .jpeg or .png files in it.", "Give a folder of images.")
    name = image_input_name(metadata)
    blobs = [p.read_bytes() for p in files]
    sets = []
    for start in range(0, len(blobs), batch):
        rows = [blobs[(start + i) % len(blobs)] for i in range(batch)]
        value = np.empty(batch, dtype=object)
        value[:] = rows
        sets.append({name: value})
    return sets


def parse_shape_mix(text: str | None) -> tuple[str, tuple[int, ...]] | None:
    """``sequence=20,50,100,200``: a label and the sizes the requests cycle through (None for no mix)."""
    if not text:
        return None
    label, sep, values = text.partition("=")
    try:
        sizes = tuple(int(v) for v in values.split(",") if v.strip())
    except ValueError:
        sizes = ()
    if not sep or not label.strip() or not sizes or min(sizes) < 1:
        raise UsageError(f"--shape-mix {text!r}: expected DIM=SIZE,SIZE,... with positive sizes.",
                         "e.g. --shape-mix sequence=20,50,100,200 (every dynamic axis but the batch axis takes "
                         "each size in turn).")
    return label.strip(), sizes


def make_input_mix(metadata: dict, batch: int, shapes: dict[str, tuple[int, ...]], mix: tuple[int, ...],
                   seed: int, source: str = "MODEL") -> list[dict[str, np.ndarray]]:
    """One set of inputs per size of ``mix``: every variable axis that ``shapes`` and ``batch`` leave free takes
    that size. Requests cycle through them, so a server sees mixed lengths in equal shares (what shape buckets
    are for: serve --shape-buckets)."""
    dims = request_dims(metadata, batch, shapes, source)
    return [_random_inputs(metadata, {k: [size if d is None else int(d) for d in v] for k, v in dims.items()},
                           seed + index) for index, size in enumerate(mix)]


async def _fetch_json(url: str, path: str) -> tuple[int, dict]:
    conn = HttpConnection(url)
    try:
        status, body = await conn.get(path)
    except OSError as exc:
        raise UsageError(f"Cannot reach {url}: {exc}.", "Is the server running? Check the URL and port.") from None
    finally:
        await conn.close()
    try:
        return status, json.loads(body) if body else {}
    except json.JSONDecodeError:
        return status, {}


# --- one worker ---------------------------------------------------------------------------------------------

async def _drive(config: LoadtestConfig, inputs: list[dict], concurrency: int, max_requests: int | None) -> dict:
    """Keep ``concurrency`` requests outstanding; latencies of those finishing after the warm-up. ``inputs``: the
    input sets requests cycle through (one, or one per size of a shape mix)."""
    protocol = config.protocol
    payloads = [http_payload(config.model, one, config.binary) if protocol == "http" else
                grpc_payload(config.model, one) for one in inputs]
    grpc_caller = GrpcCaller(config.grpc_url) if protocol == "grpc" else None
    start = time.perf_counter()
    measure_from, stop_at = start + config.warmup_s, start + config.warmup_s + config.duration_s
    latencies: list[float] = []
    errors: dict[str, int] = {}
    samples: dict[str, str] = {}
    sent = 0

    async def client() -> None:
        nonlocal sent
        conn = HttpConnection(config.url) if protocol == "http" else None
        try:
            while time.perf_counter() < stop_at and (max_requests is None or sent < max_requests):
                payload = payloads[sent % len(payloads)]
                sent += 1
                t0 = time.perf_counter()
                try:
                    if conn is not None:
                        status, body = await asyncio.wait_for(conn.post(payload), config.timeout_s)
                        code = str(status)
                        ok = status == 200
                        if not ok and code not in samples:
                            samples[code] = body[:400].decode(errors="replace")
                    else:
                        code = await grpc_caller.call(payload, config.timeout_s)
                        ok = code == "OK"
                except (asyncio.TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    code, ok = type(exc).__name__, False
                    samples.setdefault(code, str(exc)[:400])
                    if conn is not None:
                        await conn.close()
                t1 = time.perf_counter()
                if t0 < measure_from:
                    continue
                if ok:
                    latencies.append(t1 - t0)
                else:
                    errors[code] = errors.get(code, 0) + 1
                    if not ok and code in ("ConnectionRefusedError", "OSError"):
                        await asyncio.sleep(0.05)  # a refused connection answers at once: do not spin
        finally:
            if conn is not None:
                await conn.close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    if grpc_caller is not None:
        await grpc_caller.close()
    return {"latencies": latencies, "errors": errors, "error_samples": samples,
            "seconds": max(1e-9, min(time.perf_counter(), stop_at) - measure_from)}


def _worker(config: LoadtestConfig, inputs: list[dict], concurrency: int, max_requests: int | None) -> dict:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(_drive(config, inputs, concurrency, max_requests))


# --- the test -------------------------------------------------------------------------------------------

def run_loadtest(config: LoadtestConfig, progress=None) -> LoadtestReport:
    """Run every concurrency level in turn; ``progress(level_result)`` after each."""
    if config.protocol not in ("http", "grpc"):
        raise UsageError(f"--protocol must be http or grpc, got '{config.protocol}'.", "Use --protocol grpc.")
    if not config.concurrency or min(config.concurrency) < 1:
        raise UsageError("Concurrency levels must be positive integers.", "e.g. --concurrency 1,8,32")
    if config.protocol == "grpc" and not config.grpc_url:
        host = config.url.split("://")[-1].split("/")[0].rsplit(":", 1)[0]
        config = dataclasses.replace(config, grpc_url=f"{host}:8001")
    status, server = asyncio.run(_fetch_json(config.url, "/v2"))
    status_m, metadata = asyncio.run(_fetch_json(config.url, f"/v2/models/{config.model}"))
    if status_m != 200:
        raise UsageError(f"The server has no ready model '{config.model}' (HTTP {status_m}: "
                         f"{metadata.get('error', '')}).", "Check --model against GET /v2/repository/index.")
    mix = parse_shape_mix(config.shape_mix)
    source = f"{config.url} --model {config.model}"
    if config.images:
        if mix:
            raise UsageError("--images and --shape-mix both choose what requests carry.", "Give one of them.")
        inputs = make_image_inputs(metadata, config.images, config.batch)
    elif mix:
        inputs = make_input_mix(metadata, config.batch, config.shapes, mix[1], config.seed, source)
    else:
        inputs = [make_inputs(metadata, config.batch, config.shapes, config.seed, source)]
    rows = request_rows(metadata, inputs[0], config.batch)  # inferences per request: the rows sent, not --batch
    levels = []
    pool = None
    try:
        for concurrency in config.concurrency:
            workers = _workers(config.workers, concurrency)
            before = asyncio.run(_fetch_json(config.url, f"/v2/models/{config.model}/stats"))[1]
            if workers == 1:
                parts = [_worker(config, inputs, concurrency, config.max_requests)]
            else:
                pool = pool or ProcessPoolExecutor(max_workers=workers, initializer=exit_with_parent)
                shares = [concurrency // workers + (i < concurrency % workers) for i in range(workers)]
                cap = None if config.max_requests is None else -(-config.max_requests // workers)
                parts = list(pool.map(_worker, [config] * workers, [inputs] * workers,
                                      [s for s in shares], [cap] * workers))
            after = asyncio.run(_fetch_json(config.url, f"/v2/models/{config.model}/stats"))[1]
            level = _merge(concurrency, rows, parts)
            level.images = bool(config.images)
            level.server_queue_ms, level.server_compute_ms = _server_times(before, after)
            levels.append(level)
            if progress is not None:
                progress(level)
    finally:
        if pool is not None:
            pool.shutdown()
    return LoadtestReport(config, server if status == 200 else {},
                          {k: list(v.shape) for k, v in inputs[0].items()}, levels)


def _workers(requested: int, concurrency: int) -> int:
    if requested > 0:
        return min(requested, concurrency)
    cores = os.cpu_count() or 1
    return max(1, min(concurrency // 8 or 1, cores // 2 or 1, 8))


def _merge(concurrency: int, rows: int, parts: list[dict]) -> LevelResult:
    """One level from its workers' parts; ``rows``: the rows each request carries (shapes.request_rows)."""
    latencies = [x for p in parts for x in p["latencies"]]
    errors: dict[str, int] = {}
    for part in parts:
        for code, n in part["errors"].items():
            errors[code] = errors.get(code, 0) + n
    seconds = max(p["seconds"] for p in parts)
    stats = LatencyStats.from_seconds(latencies) if latencies else None
    samples: dict[str, str] = {}
    for part in parts:
        for code, text in part.get("error_samples", {}).items():
            samples.setdefault(code, text)
    return LevelResult(concurrency, len(latencies), errors, seconds, rows, stats, error_samples=samples)


def _server_times(before: dict, after: dict) -> tuple[float | None, float | None]:
    """Mean queue and compute milliseconds per request from two Triton statistics snapshots."""
    try:
        b, a = before["model_stats"][0]["inference_stats"], after["model_stats"][0]["inference_stats"]
        n = a["success"]["count"] - b["success"]["count"]
        if n <= 0:
            return None, None
        return ((a["queue"]["ns"] - b["queue"]["ns"]) / n / 1e6,
                (a["compute_infer"]["ns"] - b["compute_infer"]["ns"]) / n / 1e6)
    except (KeyError, IndexError, TypeError):
        return None, None
