"""Server throughput against in-process throughput at the same batch, with p99; optionally a GPU memory soak.

1. In process: ``pipeline.prepare`` the model at batch B on the target and time ``Runner.run`` with numpy
   in/out (the server must copy tensors in and out too) and, for reference, with IO binding.
2. Server: ``onnxaccel serve`` in a subprocess with --max-batch B, then ``loadtest`` at --concurrency C
   (binary tensors over HTTP by default, or gRPC) with requests of --request-batch rows.
3. Ratio = server inferences/s / in-process inferences/s (numpy in/out). The issue's target on the H200:
   >= 0.80 for zoo:resnet50 FP16, binary, concurrency 64.
4. Added latency per request: server p50 at concurrency 1 minus the in-process p50 at the request's batch.
5. ``--server-workers 1,4,4s2``: one server run per value (``N``: ``serve --workers N``; ``Ns``/``NsI``: the same
   with ``--shared-models``, and ``--instances I`` in the model process; a value may go on with more serve
   options for its run: ``"5s3,5s3 --max-queue-delay-ms 1"``); the in-process reference is measured once. Each
   run reports the server's CPU per request by process role, the load generator's, how busy the machine was,
   and the mean time per batch of each phase (join, run; copy_in, replay, copy_out) from /metrics.
   ``--py-spy S`` samples the (single-process)
   server's Python stacks for S seconds under load and prints where its time goes (needs py-spy on PATH).
6. ``--soak S``: a further S seconds of load at concurrency C while the telemetry sampler reads GPU memory and
   /metrics gives the server's RSS; reports memory after warm-up and at the end (growth should be ~0 with
   arena_extend_strategy kSameAsRequested).
7. ``--server-workers default``: the server with no layout flag at all (serve picks its own layout on a GPU
   target, plan.py); the ratio is also given against in-process IO binding (issue 22's reference).
8. ``--images DIR``: after the first server run, the same spec serving --images-model (or --model with --preprocess
   imagenet) is sent the folder's JPEG/PNG files, one per row: images/s, p50 and p99 beside the tensor run's.
9. ``--concurrency 64,256``: each server run is loaded at every level in turn (the first is the run's main figure:
   CPU, phases, round trip; the others give infer/s, p50, p99 and errors under ``levels``).
   ``--inprocess-duration 0`` skips the in-process reference (no ratios; an A/B of servers behind one load
   generator, benchmarks/ab_regression.sh) and ``--skip-concurrency-1`` the added-latency run at concurrency 1.

Usage:
  python benchmarks/serve_throughput.py --model zoo:resnet50 --target cuda:0 --precision fp16 --batch 64 \
      --concurrency 64 --duration 30 --json out/serve_h200.json
  python benchmarks/serve_throughput.py --model zoo:squeezenet --target cpu --batch 8 --concurrency 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from onnxaccel.bench.timing import measure
from onnxaccel.pipeline import prepare
from onnxaccel.loadtest import LoadtestConfig, run_loadtest
from onnxaccel.target import parse_target

#: The server's command: `serve` alone on a Typer app (the CLI's other commands not imported); a tree whose CLI has no
#: onnxaccel.cli.serve.register runs its whole CLI instead (sys.argv is ["-c", "serve", ...] either way).
SERVE = ("try:\n    import typer\n    from onnxaccel.cli.serve import register\n"
         "except (ImportError, AttributeError):\n    import runpy\n"
         "    runpy.run_module('onnxaccel.cli.main', run_name='__main__')\n"
         "else:\n    app = typer.Typer()\n    app.callback()(lambda: None)\n    register(app)\n    app()")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def in_process(args) -> dict:
    target = parse_target(args.target, precision=args.precision)
    out: dict = {}
    if args.inprocess_duration <= 0:
        return out
    for batch in sorted({args.batch, args.request_batch}):
        prepared = prepare(args.model, target, batch=batch)
        for iobinding in (False, True):
            timing = measure(prepared.runner, prepared.feeds, batch=batch, warmup=10, runs=None,
                             duration=args.inprocess_duration, iobinding=iobinding)
            out[f"b{batch}_{'iobinding' if iobinding else 'numpy'}"] = {
                "batch": batch, "iobinding": iobinding, "items_per_s": timing.throughput,
                "p50_ms": timing.latency.p50, "p99_ms": timing.latency.p99}
        prepared.close()
    return out


def server_spec(text: str) -> str:
    """``N`` (serve --workers N), ``Ns`` (+ --shared-models) or ``NsI`` (+ --instances I in the model process),
    optionally followed by more serve options for that run only: ``5s3 --max-queue-delay-ms 1``."""
    import re

    spec, _, extra = text.strip().partition(" ")
    if spec != DEFAULT and not re.fullmatch(r"\d+(s\d*)?", spec):
        raise argparse.ArgumentTypeError(f"server spec {text!r}: use N, Ns, NsI (e.g. 4, 4s, 4s2) or default, "
                                         "then options if any")
    return f"{spec} {extra.strip()}".strip()


#: The server spec that passes no layout flag (serve picks its layout itself: serve/layout.py).
DEFAULT = "default"


def parse_spec(spec: str) -> tuple[int, bool, int | None]:
    if spec == DEFAULT:
        return 0, False, None
    workers, _, instances = spec.partition("s")
    return int(workers), "s" in spec, int(instances) if instances else None


def start_server(args, log: Path, spec: str = "1", extra: str = "", model: str | None = None
                 ) -> tuple[subprocess.Popen, str, str]:
    """``onnxaccel serve`` for ``spec``; ``default`` passes only the ports, --max-batch and the queue delay (no
    layout, instance, queue or arena flag: what a user who types just those gets)."""
    workers, shared, instances = parse_spec(spec)
    http, grpc = free_port(), free_port()
    cmd = [sys.executable, "-c", SERVE, "serve", model or args.model, "--target", args.server_target or args.target,
           "--http-port", str(http), "--grpc-port", str(grpc), "--max-batch", str(args.batch),
           "--max-queue-delay-ms", str(args.delay_ms)]
    if spec != DEFAULT:
        cmd += ["--instances", str(instances or args.instances), "--max-queue", str(max(256, 4 * max(args.levels))),
                "--max-request-mb", "512", "--workers", str(workers)]
    if args.precision:
        cmd += ["--precision", args.precision]
    if shared:
        cmd += ["--shared-models"]
    if parse_target(args.target).is_gpu and spec != DEFAULT:
        cmd += ["--arena-extend-strategy", "kSameAsRequested"]
    cmd += args.serve_args.split() + extra.split()  # last: a repeated option takes its last value
    # SERVE_PYTHONPATH: run the server from another tree than the load generator (A/B of the server alone).
    env = {**os.environ, "PYTHONPATH": os.environ["SERVE_PYTHONPATH"]} if os.environ.get("SERVE_PYTHONPATH") else None
    began = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{http}"
    deadline = time.monotonic() + args.load_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {log.read_text()}")
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                proc.ready_s = time.monotonic() - began  # start-up: the command to its first ready answer
                return proc, url, f"127.0.0.1:{grpc}"
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"server not ready after {args.load_timeout} s: {log.read_text()}")


def model_name(source: str) -> str:
    return source.split(":", 1)[1] if source.startswith("zoo:") else Path(source).stem


def load(args, url, grpc, concurrency, duration, batch, images: str | None = None, model: str | None = None) -> dict:
    config = LoadtestConfig(url=url, grpc_url=grpc, model=model_name(model or args.model), protocol=args.protocol,
                            binary=not args.json_tensors, concurrency=(concurrency,), duration_s=duration,
                            warmup_s=args.warmup, batch=batch, workers=args.workers, images=images)
    return run_loadtest(config).levels[0].to_dict()


def server_batches(url: str, model: str) -> dict:
    """Executions, rows and mean batch from the server's statistics (all workers)."""
    stats = httpx.get(f"{url}/v2/models/{model}/stats", timeout=10).json()["model_stats"][0]
    runs, rows = stats["execution_count"], stats["inference_count"]
    return {"executions": runs, "rows": rows, "mean_batch": rows / runs if runs else None,
            "compute_ms_per_request": stats["inference_stats"]["compute_infer"]["ns"] / 1e6
            / max(1, stats["inference_stats"]["compute_infer"]["count"])}


def _process_tree(root: int) -> list[int]:
    """``root`` and its descendants (serve --workers children), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def cpu_ticks(root: int) -> dict[tuple[int, int], tuple[int, str]]:
    """user+system clock ticks and process name per (process, thread) of the server's process tree (Linux
    /proc). The server names its processes (onnxaccel-model, onnxaccel-wN: serve/workers.py name_process)."""
    ticks = {}
    for pid in _process_tree(root):
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for task in tasks:
            try:
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks[(pid, int(task.name))] = (int(fields[11]) + int(fields[12]), comm)
    return ticks


def _role(comm: str) -> str:
    if comm == "onnxaccel-model":
        return "model_process"
    if comm.startswith("onnxaccel-w"):
        return "http_workers"
    return "serve_process"  # the whole server with --workers 1; the supervisor otherwise


def cpu_per_request(before: dict, after: dict, requests: int) -> dict:
    """Server CPU milliseconds per request: each process's main (event loop) thread, its other threads, all;
    and the same per role (model process, decoding workers, supervisor)."""
    hz = os.sysconf("SC_CLK_TCK")
    main = other = 0
    roles: dict[str, dict[str, float]] = {}
    per = 1e3 / hz / max(1, requests)
    for key, (value, comm) in after.items():
        spent = value - before.get(key, (0, comm))[0]
        role = roles.setdefault(_role(comm), {"event_loop_thread_ms": 0.0, "other_threads_ms": 0.0})
        if key[0] == key[1]:
            main += spent
            role["event_loop_thread_ms"] += spent * per
        else:
            other += spent
            role["other_threads_ms"] += spent * per
    return {"event_loop_threads_ms": main * per, "other_threads_ms": other * per, "total_ms": (main + other) * per,
            "by_role": roles}


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot (/proc/stat), for the machine's load during a run."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def client_cpu_s() -> float:
    """CPU seconds of this process and its finished children (the load generator's worker processes)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def scrape(url: str) -> dict[str, float]:
    """The server's batch metrics (Prometheus text): phase sums and counts, batch-size buckets, by series."""
    wanted = ("onnxaccel_batch_phase_seconds_sum", "onnxaccel_batch_phase_seconds_count",
              "onnxaccel_batch_size_bucket", "onnxaccel_batch_size_sum", "onnxaccel_batch_size_count")
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(wanted):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


def batch_phases(before: dict, after: dict) -> dict:
    """Mean milliseconds per batch of each phase, and the share of batches per size bucket, over a run."""
    import re

    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    phases, sizes = {}, {}
    for series, value in delta.items():
        phase = re.search(r'phase="([^"]+)"', series)
        if series.startswith("onnxaccel_batch_phase_seconds_sum") and phase:
            count = delta.get(series.replace("_sum{", "_count{"), 0.0)
            phases[phase.group(1)] = {"mean_ms": value / count * 1e3 if count else None, "batches": count}
        elif series.startswith("onnxaccel_batch_size_bucket"):
            le = re.search(r'le="([^"]+)"', series)
            if le:
                sizes[le.group(1)] = value
    total = max(sizes.values(), default=0.0)
    cumulative = sorted(((float(k), v) for k, v in sizes.items()), key=lambda kv: kv[0])
    share, previous = {}, 0.0
    for le, value in cumulative:
        if value - previous > 0 and total:
            share[f"<={le:g}"] = round((value - previous) / total, 3)
        previous = value
    return {"phases_ms": phases, "batch_size_share": share}


def py_spy(pid: int, seconds: float, out: Path) -> list[tuple[str, float]]:
    """py-spy's raw samples of the server under load, reduced to the functions holding the most samples."""
    import collections

    import shutil

    raw = out.with_suffix(".pyspy.txt")
    beside = Path(sys.executable).parent / "py-spy"
    exe = os.environ.get("PY_SPY") or shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if exe is None:
        sys.stderr.write("py-spy not found (PATH, PY_SPY, or beside the Python executable): no profile\n")
        return []
    subprocess.run([exe, "record", "-p", str(pid), "-d", str(int(seconds)), "-f", "raw", "-o", str(raw),
                    "--nonblocking", "--threads"], check=False, capture_output=True, timeout=seconds + 60)
    if not raw.exists():
        return []
    own, total = collections.Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        own[stack.split(";")[-1][:110]] += int(count)
    return [(name, n / total) for name, n in own.most_common(15)] if total else []


def soak(args, url, grpc, pid: int) -> dict:
    """Load for args.soak seconds; GPU memory (telemetry sampler) and the server's RSS over time: summed over
    its process tree from /proc (with --workers, /metrics reports only the answering worker's process)."""
    from onnxaccel.system.telemetry_backends import open_backends

    backends, notes = open_backends()

    def gpu_used() -> list:
        return [s.memory_used_bytes for b in backends for s in b.read()]

    def rss() -> float | None:
        total = 0
        for member in _process_tree(pid):
            try:
                for line in Path(f"/proc/{member}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                continue
        return float(total) if total else None

    chunks, samples = max(2, int(args.soak // 10)), []
    for i in range(chunks):
        level = load(args, url, grpc, args.concurrency, args.soak / chunks, args.request_batch)
        samples.append({"t_s": round((i + 1) * args.soak / chunks, 1), "gpu_memory_used_bytes": gpu_used(),
                        "server_rss_bytes": rss(), "inferences_per_s": level["inferences_per_s"],
                        "errors": level["error_count"]})
    for backend in backends:
        backend.close()
    first, last = samples[0], samples[-1]
    growth = [b - a for a, b in zip(first["gpu_memory_used_bytes"], last["gpu_memory_used_bytes"])]
    return {"seconds": args.soak, "samples": samples, "gpu_memory_growth_bytes": growth,
            "rss_growth_bytes": (last["server_rss_bytes"] or 0) - (first["server_rss_bytes"] or 0),
            "notes": notes}


def write_result(args, reference: dict, runs: list[dict]) -> None:
    """The JSON report so far (rewritten after every run, so a run cut short keeps the finished ones)."""
    if not args.json or not runs:
        return
    best = max(runs, key=lambda r: r["ratio_server_over_in_process"] or r["server"]["inferences_per_s"])
    result = {
        "schema": "onnxaccel.bench.serve-throughput/2", "date": datetime.now(timezone.utc).isoformat(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "in_process": reference, "runs": runs, "best_ratio": best["ratio_server_over_in_process"],
        "best_server_workers": best["server_spec"],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))


def print_header(args, reference: dict) -> None:
    base = reference.get(f"b{args.batch}_numpy")
    sys.stdout.write(
        f"{args.model} on {args.target}{'/' + args.precision if args.precision else ''}"
        f"{' (server: ' + args.server_target + ')' if args.server_target else ''}, batch {args.batch}, "
        f"{args.protocol}{'' if args.json_tensors or args.protocol == 'grpc' else ' binary'}, "
        f"concurrency {','.join(map(str, args.levels))}, requests of {args.request_batch} row(s)\n"
        + (f"  in-process (numpy in/out) b{args.batch}: {base['items_per_s']:,.1f} items/s, "
           f"p99 {base['p99_ms']:.2f} ms; IO binding: {reference[f'b{args.batch}_iobinding']['items_per_s']:,.1f}\n"
           if base else "  in-process reference skipped (--inprocess-duration 0)\n"))


def round_trip(server: dict, batches: dict, concurrency: int, bound: float) -> dict | None:
    """Where a request's time goes at this concurrency (Little's law: requests in flight = rate x time in the
    system): the mean latency split into the model process's queue and run and the rest (client, network, decoding
    worker, the hops to the model process and back); and the round trip that would reach ``bound``/s."""
    latency = (server.get("latency") or {}).get("mean_ms")
    if not latency:
        return None
    queue = server.get("server_queue_ms") or 0.0
    run = batches.get("compute_ms_per_request") or 0.0
    return {"mean_ms": latency, "queue_ms": queue, "run_ms": run, "rest_ms": latency - queue - run,
            "needed_for_bound_ms": concurrency / bound * 1e3 if bound else None,
            "needed_for_85pct_ms": concurrency / (0.85 * bound) * 1e3 if bound else None}


def print_run(args, run: dict) -> None:
    server, lat = run["server"], run["server"]["latency"] or {}
    ratio = run["ratio_server_over_in_process"]
    sys.stdout.write(
        f"  server {run['server_spec']} (ready after {run.get('server_ready_s') or float('nan'):.1f} s): "
        f"{server['inferences_per_s']:,.1f} infer/s at c={args.concurrency} "
        + (f"({ratio:.1%} of in-process), " if ratio is not None else "")
        + f"p50 {lat.get('p50_ms', float('nan')):.2f} ms, "
        f"p99 {lat.get('p99_ms', float('nan')):.2f} ms, errors {server['error_count']}; mean batch "
        f"{run['server_batches']['mean_batch'] or 0:.1f}, run {run['server_batches']['compute_ms_per_request']:.2f} ms "
        f"per request, queue {server.get('server_queue_ms') or 0:.2f} ms\n")
    for code, text in (server.get("error_samples") or {}).items():
        sys.stdout.write(f"    first {code} error: {text[:300]}\n")
    if run["ratio_server_over_in_process_iobinding"] is not None:
        sys.stdout.write(f"    = {run['ratio_server_over_in_process_iobinding']:.1%} of in-process with IO binding\n")
    for level in run.get("levels", [])[1:]:
        share = level["ratio_over_in_process_iobinding"]
        sys.stdout.write(f"    c={level['concurrency']}: {level['inferences_per_s']:,.1f} infer/s"
                         + (f" = {share:.1%} of in-process with IO binding" if share is not None else "")
                         + f", p50 {level['p50_ms'] or float('nan'):.2f} ms, p99 {level['p99_ms'] or float('nan'):.2f} ms, "
                         f"errors {level['errors']}\n")
    trip = run.get("round_trip")
    if trip:
        needed = trip["needed_for_85pct_ms"]
        sys.stdout.write(f"    round trip {trip['mean_ms']:.2f} ms = queue {trip['queue_ms']:.2f} + run {trip['run_ms']:.2f} + "
                         f"rest (client, network, decoding, hops) {trip['rest_ms']:.2f}"
                         + (f"; 85 % of IO binding at c={args.concurrency} needs <= {needed:.2f} ms" if needed else "")
                         + "\n")
    if run.get("images"):
        im = run["images"]
        sys.stdout.write(f"    JPEG requests ({im['serve_args'] or im['model']}): {im['images_per_s']:,.1f} images/s, "
                         f"p50 {im['p50_ms'] or float('nan'):.2f} ms, p99 {im['p99_ms'] or float('nan'):.2f} ms, "
                         f"errors {im['errors']}, mean batch {im['mean_batch'] or 0:.1f} (tensor requests: "
                         f"{server['inferences_per_s']:,.1f}/s, p99 {lat.get('p99_ms', float('nan')):.2f} ms)\n")
        for code, text in (im.get("error_samples") or {}).items():
            sys.stdout.write(f"      first {code} error: {text[:300]}\n")
    cpu = run["server_cpu_ms_per_request"]
    sys.stdout.write(f"    server CPU per request: event loop {cpu['event_loop_threads_ms']:.3f} ms, other threads "
                     f"{cpu['other_threads_ms']:.3f} ms, all {cpu['total_ms']:.3f} ms; load generator "
                     f"{cpu['client_ms']:.3f} ms; machine {cpu['machine_busy'] or 0:.0%} busy "
                     f"({os.cpu_count()} cores)\n")
    for role, spent in sorted(cpu["by_role"].items()):
        sys.stdout.write(f"      {role}: event loop {spent['event_loop_thread_ms']:.3f} ms, other threads "
                         f"{spent['other_threads_ms']:.3f} ms\n")
    phases = run["batch_phases"]
    sys.stdout.write("    per batch: " + ", ".join(f"{k} {v['mean_ms']:.2f} ms" for k, v in phases["phases_ms"].items()
                                                if v["mean_ms"] is not None)
                     + "; batch sizes " + ", ".join(f"{k}: {v:.0%}" for k, v in phases["batch_size_share"].items())
                     + "\n")
    if run["added_latency_p50_ms_at_concurrency_1"] is not None:
        sys.stdout.write(f"    added latency per request (c=1, p50): "
                         f"{run['added_latency_p50_ms_at_concurrency_1']:.2f} ms\n")
    for name, share in run["py_spy_top"] or []:
        sys.stdout.write(f"    py-spy {share:6.1%}  {name}\n")
    if run["soak"]:
        soaked = run["soak"]
        sys.stdout.write(f"  soak {args.soak:g} s: GPU memory growth {soaked['gpu_memory_growth_bytes']} bytes, "
                         f"server RSS growth {soaked['rss_growth_bytes'] / 2**20:.1f} MiB\n")
    sys.stdout.flush()

def image_run(args, spec: str, extra: str, index: int) -> dict:
    """The same server spec fed encoded images: a server of --images-model (or --model with --preprocess),
    load at --concurrency with one file per row; images/s, p50, p99 and errors."""
    model = args.images_model or args.model
    more = extra if args.images_model else f"{extra} --preprocess {args.images_preprocess}"
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve_throughput_{os.getpid()}_{index}_{spec}_images.log"
    proc, url, grpc = start_server(args, log, spec, more, model=model)
    try:
        level = load(args, url, grpc, args.concurrency, args.duration, args.request_batch, images=args.images,
                     model=model)
        batches = server_batches(url, model_name(model))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(90)
    lat = level["latency"] or {}
    return {"model": model, "serve_args": more.strip(), "images_per_s": level["inferences_per_s"],
            "p50_ms": lat.get("p50_ms"), "p99_ms": lat.get("p99_ms"), "errors": level["error_count"],
            "error_samples": level.get("error_samples"), "mean_batch": batches["mean_batch"], "loadtest": level}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="zoo:resnet50")
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--batch", type=int, default=64, help="server --max-batch = in-process batch")
    parser.add_argument("--request-batch", type=int, default=1, help="rows per client request")
    parser.add_argument("--concurrency", type=lambda v: [int(x) for x in v.split(",")], default=[64],
                        help="client connections; comma-separated for several levels per server run (64,256)")
    parser.add_argument("--delay-ms", type=float, default=2.0, help="server --max-queue-delay-ms")
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--protocol", default="http", choices=["http", "grpc"])
    parser.add_argument("--json-tensors", action="store_true", help="JSON instead of binary tensors (HTTP)")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--inprocess-duration", type=float, default=10.0, help="0: no in-process reference")
    parser.add_argument("--skip-concurrency-1", action="store_true", help="no added-latency run at concurrency 1")
    parser.add_argument("--workers", type=int, default=0, help="load generator processes (0: automatic)")
    parser.add_argument("--server-workers", type=lambda v: [server_spec(x) for x in v.split(",")], default=["1"],
                        help="comma-separated serve --workers values, one server run each")
    parser.add_argument("--py-spy", type=float, default=0.0, help="seconds of py-spy sampling (workers=1 run)")
    parser.add_argument("--server-target", default=None, help="the server's target if not --target, e.g. "
                        "'cuda:0?enable_cuda_graph=1' (the in-process reference keeps --target)")
    parser.add_argument("--serve-args", default="", help="more `onnxaccel serve` options, e.g. '--gpu-wait auto'")
    parser.add_argument("--soak", type=float, default=0.0, help="seconds of GPU memory soak after the run")
    parser.add_argument("--load-timeout", type=float, default=600.0)
    parser.add_argument("--images", default=None, help="a folder of JPEG/PNG files: after the first server run, one more "
                        "with the same spec sending these files (BYTES, one image per row) to a server of "
                        "--images-model, or of --model with --images-preprocess; images/s and p99 against the "
                        "tensor run")
    parser.add_argument("--images-model", default=None, help="the model the image server runs (e.g. the output of "
                        "`optimize --embed-preprocess imagenet`: JPEGs decoded to uint8, preprocessing in the graph)")
    parser.add_argument("--images-preprocess", default="imagenet", help="serve --preprocess for the image server")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.levels, args.concurrency = args.concurrency, args.concurrency[0]

    reference = in_process(args)
    base = reference.get(f"b{args.batch}_numpy")
    print_header(args, reference)
    runs = []
    for index, variant in enumerate(args.server_workers):
        spec, _, extra = variant.partition(" ")
        workers = parse_spec(spec)[0]
        log = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve_throughput_{os.getpid()}_{index}_{spec}.log"
        proc, url, grpc = start_server(args, log, spec, extra)
        profile = None
        try:
            if args.py_spy and spec == "1":
                import threading

                holder = {}
                spy = threading.Thread(target=lambda h=holder, pid=proc.pid, out=log: h.update(
                    top=py_spy(pid, args.py_spy, out)))
                spy.start()
            ticks, machine, client, metrics = cpu_ticks(proc.pid), machine_cpu(), client_cpu_s(), scrape(url)
            server = load(args, url, grpc, args.concurrency, args.duration, args.request_batch)
            more = {c: load(args, url, grpc, c, args.duration, args.request_batch) for c in args.levels[1:]}
            sent = server["requests"] + int(server["inferences_per_s"] * args.warmup / max(1, args.request_batch))
            cpu = cpu_per_request(ticks, cpu_ticks(proc.pid), sent)
            busy, total = (b - a for a, b in zip(machine, machine_cpu()))
            cpu["client_ms"] = (client_cpu_s() - client) * 1e3 / max(1, sent)
            cpu["machine_busy"] = busy / total if total else None
            phases = batch_phases(metrics, scrape(url))
            if args.py_spy and spec == "1":
                spy.join()
                profile = holder.get("top")
            batches = server_batches(url, model_name(args.model))
            single = load(args, url, grpc, 1, min(args.duration, 10.0), args.request_batch) \
                if index == 0 and not args.skip_concurrency_1 else None
            soaked = soak(args, url, grpc, proc.pid) if args.soak > 0 and index == len(args.server_workers) - 1 else None
        finally:
            proc.send_signal(signal.SIGTERM)
            exit_code = proc.wait(90)
        images = image_run(args, spec, extra, index) if args.images and index == 0 else None
        ratio = server["inferences_per_s"] / base["items_per_s"] if base and base["items_per_s"] else None
        bound = (reference.get(f"b{args.batch}_iobinding") or {}).get("items_per_s")
        added = single["latency"]["p50_ms"] - reference[f"b{args.request_batch}_numpy"]["p50_ms"] \
            if single and single["latency"] and reference else None
        levels = [{"concurrency": c, "inferences_per_s": level["inferences_per_s"],
                   "p50_ms": (level["latency"] or {}).get("p50_ms"), "p99_ms": (level["latency"] or {}).get("p99_ms"),
                   "errors": level["error_count"],
                   "ratio_over_in_process": level["inferences_per_s"] / base["items_per_s"] if ratio is not None else None,
                   "ratio_over_in_process_iobinding": level["inferences_per_s"] / bound if bound else None}
                  for c, level in [(args.concurrency, server), *more.items()]]
        runs.append({"server_workers": workers, "server_spec": variant, "shared_models": parse_spec(spec)[1],
                     "model_instances": parse_spec(spec)[2] or args.instances, "server": server, "server_batches": batches,
                     "server_concurrency_1": single, "ratio_server_over_in_process": ratio,
                     "added_latency_p50_ms_at_concurrency_1": added, "server_exit_code": exit_code,
                     "soak": soaked, "py_spy_top": profile, "server_cpu_ms_per_request": cpu,
                     "batch_phases": phases, "extra_serve_args": extra, "images": images,
                     "ratio_server_over_in_process_iobinding": server["inferences_per_s"] / bound if bound else None,
                     "levels": levels,
                     "round_trip": round_trip(server, batches, args.concurrency, bound)})
        runs[-1]["server_ready_s"] = getattr(proc, "ready_s", None)
        print_run(args, runs[-1])
        write_result(args, reference, runs)


if __name__ == "__main__":
    main()
