"""`onnxaccel serve` against the real Triton Inference Server with its C++ ONNX Runtime backend (issue 37), driven
by the same load generator, Triton's perf_analyzer, on the same model, batching settings and machine.

Triton: a ``tritonserver`` command (``--triton``) that has the ``onnxruntime`` backend in its backend directory,
e.g. Triton 2.51 from the nvidia-pytriton 0.7.0 wheel (its ``tritonserver`` binary, run directly) with
triton-inference-server/onnxruntime_backend r24.10 built against a pip ONNX Runtime library. That backend build
is not part of this repository; docs/BENCHMARKS.md says how the one measured was made.

For each server in turn (one at a time, so they never compete for the cores): start it, time it to
``/v2/health/ready``, then for each rows-per-request and concurrency run each load generator over HTTP:
perf_analyzer (concurrency mode, ``-b ROWS``; its CSV row: infer/s, p50/p99 and the server's queue and compute
times) and ``onnxaccel loadtest`` (``--generators``; binary HTTP, infer/s and p50/p99). Both servers get the same
dynamic batching: ``--max-batch`` rows, ``--delay-us`` queue delay, ``--instances`` model instances (Triton:
``instance_group`` of that count; onnxaccel: ``--instances``). The delay policy is each server's default unless
``--serve-args "--queue-delay fixed"``: Triton always waits the delay, onnxaccel's adaptive default waits only
for requests already on their way (the policy used is recorded and printed), so below the max batch the figures
compare the policies as much as the servers. The in-process reference is onnxaccel's own
model-only run at ``--max-batch`` rows with IO binding (``bench``'s timing) on ``--target`` (any provider).

Usage:
  python benchmarks/serve_vs_triton.py --model MODEL.onnx --triton .tritonort/bin/tritonserver \\
      [--concurrency 1,4,16] [--rows 1,8] [--max-batch 8] [--delay-us 2000] [--instances 1] \\
      [--target cpu] [--serve-args ""] [--kind cpu|gpu] [--serve-instances same|auto]
      [--generators perf_analyzer,loadtest,perf_analyzer_grpc,perf_analyzer_shm]
      [--interval-ms 2000] [--warmup-s 0] [--out result.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import httpx
from serve_throughput import batch_phases, client_cpu_s, cpu_ticks, machine_cpu, scrape, server_batches

ROOT = Path(__file__).resolve().parent.parent
PERF_ANALYZER = Path(sys.executable).parent / "perf_analyzer"
PERF_LIBS = ROOT / ".venv" / "perflibs" / "lib"
CLI = "import sys; from onnxaccel.cli.main import main; sys.argv[0] = 'onnxaccel'; main()"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"server not ready after {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def triton_repo(root: Path, model: Path, name: str, args) -> Path:
    (root / name / "1").mkdir(parents=True)
    shutil.copy(model, root / name / "1" / "model.onnx")
    kind = "KIND_GPU" if args.kind == "gpu" else "KIND_CPU"
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: {args.max_batch}\n'
        f"dynamic_batching {{ max_queue_delay_microseconds: {args.delay_us} }}\n"
        f"instance_group [ {{ kind: {kind}, count: {args.instances} }} ]\n{args.triton_config}\n")
    return root


def start_triton(args, repo: Path, log: Path) -> tuple[subprocess.Popen, str]:
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [args.triton, f"--model-repository={repo}", f"--http-port={http}", f"--grpc-port={grpc}",
           f"--metrics-port={metrics}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
           "--allow-metrics=false", "--log-verbose=0"]
    return (subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT), f"http://127.0.0.1:{http}",
            f"127.0.0.1:{grpc}")


def start_serve(args, model: Path, log: Path) -> tuple[subprocess.Popen, str]:
    http, grpc = free_port(), free_port()
    cmd = [sys.executable, "-c", CLI, "serve", str(model), "--target", args.target, "--host", "127.0.0.1",
           "--http-port", str(http),
           "--grpc-port", str(grpc), "--max-batch", str(args.max_batch), "--max-queue-delay-ms",
           str(args.delay_us / 1000), *(["--instances", str(args.instances)] if args.serve_instances == "same" else []),
           *shlex.split(args.serve_args)]
    return (subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT), f"http://127.0.0.1:{http}",
            f"127.0.0.1:{grpc}")


# perf_analyzer's variants: the protocol it speaks and where its inputs and outputs travel.
PERF_VARIANTS = {"perf_analyzer": [], "perf_analyzer_grpc": ["-i", "grpc"],
                 "perf_analyzer_shm": ["--shared-memory", "system"],
                 "perf_analyzer_grpc_shm": ["-i", "grpc", "--shared-memory", "system"]}


def perf_analyzer(url: str, name: str, rows: int, concurrency: int, args, out: Path, variant: str = "perf_analyzer",
                  grpc: str = "") -> dict:
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(PERF_LIBS),
                                                                         os.environ.get("LD_LIBRARY_PATH")]))}
    if args.grpc_channel_share:  # tritonclient's gRPC channel cache: clients per channel (TCP connection), 6 unset
        env["TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT"] = str(args.grpc_channel_share)
    extra = PERF_VARIANTS[variant]
    cmd = [args.perf_analyzer, "-m", name, "-u", grpc if "grpc" in extra else url.removeprefix("http://"),
           *extra, "-b", str(rows),
           "--concurrency-range", str(concurrency), "-p", str(args.interval_ms), "--max-trials", "10",
           "--stability-percentage", str(args.stability),
           "-f", str(out), *shlex.split(args.perf_args)]
    out.unlink(missing_ok=True)  # a run that writes no report must not show the previous cell's
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr)[-600:]}
    row = next(csv.DictReader(out.read_text().splitlines()))
    return {"infer_per_s": float(row["Inferences/Second"]), "p50_us": int(row["p50 latency"]),
            "p99_us": int(row["p99 latency"]), "server_queue_us": int(row["Server Queue"]),
            "server_compute_us": int(row["Server Compute Input"]) + int(row["Server Compute Infer"])
            + int(row["Server Compute Output"]), "client_send_recv_us": int(row["Client Send"])
            + int(row["Network+Server Send/Recv"]) + int(row["Client Recv"]),
            # its parts: the client's own send and receive, and the time on the wire and in the server's front
            "client_send_us": int(row["Client Send"]), "client_recv_us": int(row["Client Recv"]),
            "network_server_us": int(row["Network+Server Send/Recv"])}


def in_process(model: Path, target: str, max_batch: int, seconds: float = 3.0) -> dict:
    """Model-only rows/s and latency at max_batch rows with IO binding, as `onnxaccel bench` measures it."""
    from onnxaccel.bench.timing import measure
    from onnxaccel.pipeline import prepare
    from onnxaccel.target import parse_target

    prepared = prepare(str(model), parse_target(target), batch=max_batch)
    try:
        timing = measure(prepared.runner, prepared.feeds, batch=max_batch, warmup=10, runs=None, duration=seconds,
                         iobinding=True)
    finally:
        prepared.close()
    return {"rows_per_s": round(timing.throughput, 1), "p50_ms": timing.latency.p50, "target": target}


def model_counts(url: str, name: str) -> tuple[int, int]:
    """(inference_count, execution_count) of the model from the protocol's statistics extension (both servers),
    (0, 0) where it cannot be read."""
    try:
        found = server_batches(url, name)
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return 0, 0
    return found["rows"], found["executions"]


def process_cpu_s(root: int) -> dict[int, float]:
    """CPU seconds so far of the server's process tree, by process (serve_throughput.cpu_ticks' threads added)."""
    tick, spent = os.sysconf("SC_CLK_TCK"), {}
    for (pid, _thread), (ticks, _comm) in cpu_ticks(root).items():
        spent[pid] = spent.get(pid, 0.0) + ticks / tick
    return spent


class CellAccount:
    """Where a cell's CPU went and what its batches held: the machine's busy cores, the load generator's
    (perf_analyzer is a child process: its usage arrives when it exits; loadtest runs in this process) and the
    server's process tree, each averaged over the cell's wall time; the rows per execution; and onnxaccel's mean
    batch phases (serve_throughput's readers of /proc, the statistics and /metrics)."""

    def __init__(self, url: str, name: str, server_pid: int):
        self.url, self.name, self.pid = url, name, server_pid
        self.counts = model_counts(url, name)
        self.metrics = self._scrape()
        self.server = process_cpu_s(server_pid)
        self.machine = machine_cpu()
        self.generator = client_cpu_s()
        self.wall = time.monotonic()

    def _scrape(self) -> dict[str, float]:
        try:
            return scrape(self.url)
        except httpx.HTTPError:
            return {}

    def finish(self, cell: dict) -> dict:
        wall = time.monotonic() - self.wall
        generator = client_cpu_s() - self.generator
        busy, total = (a - b for a, b in zip(machine_cpu(), self.machine))
        inferences, executions = (a - b for a, b in zip(model_counts(self.url, self.name), self.counts))
        if wall > 0 and total > 0:
            spent = {p: seconds - self.server.get(p, 0.0) for p, seconds in process_cpu_s(self.pid).items()}
            cell["cpu_cores"] = {"machine_busy": round(busy / total * (os.cpu_count() or 1), 2),
                                 "generator": round(generator / wall, 2),
                                 "server": round(sum(spent.values()) / wall, 2),
                                 # its busiest process (one worker holding most connections, or the model process)
                                 "server_busiest_process": round(max(spent.values(), default=0.0) / wall, 2),
                                 "server_processes": len(spent)}
        if executions > 0:
            cell["rows_per_execution"] = round(inferences / executions, 1)
        phases = {phase: round(found["mean_ms"], 3)
                  for phase, found in batch_phases(self.metrics, self._scrape())["phases_ms"].items()
                  if found["mean_ms"] is not None}
        if phases:
            cell["batch_phase_ms"] = phases  # the mean per batch over the cell
        return cell


def loadtest(url: str, name: str, rows: int, concurrency: int, seconds: float) -> dict:
    """One level of `onnxaccel loadtest` (binary HTTP, one client process)."""
    from onnxaccel.loadtest import LoadtestConfig, run_loadtest

    level = run_loadtest(LoadtestConfig(url=url, model=name, concurrency=(concurrency,), duration_s=seconds,
                                        warmup_s=1.0, batch=rows, binary=True)).levels[0].to_dict()
    latency = level.get("latency") or {}
    if level["error_count"] or not latency:
        return {"error": f"{level['error_count']} errors: {level.get('error_samples')}"}
    return {"infer_per_s": round(level["inferences_per_s"], 1), "p50_us": round(latency["p50_ms"] * 1e3),
            "p99_us": round(latency["p99_ms"] * 1e3)}


def queue_delay(url: str, name: str) -> str:
    """The queue delay policy onnxaccel's batcher applies, from the model's config."""
    try:
        with urllib.request.urlopen(f"{url}/v2/models/{name}/config", timeout=5) as r:
            return json.load(r).get("parameters", {}).get("queue_delay", {}).get("string_value", "?")
    except OSError:
        return "?"


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--name", default=None, help="Model name on both servers (default: the file's stem).")
    ap.add_argument("--triton", default=str(ROOT / ".tritonort" / "bin" / "tritonserver"))
    ap.add_argument("--triton-config", default="", help="Extra config.pbtxt text (e.g. ORT backend parameters).")
    ap.add_argument("--perf-analyzer", default=str(PERF_ANALYZER))
    ap.add_argument("--perf-args", default="", help="Extra perf_analyzer arguments (e.g. --shape for dynamic axes).")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--delay-us", type=int, default=2000)
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--serve-instances", choices=["same", "auto"], default="same",
                    help="same: onnxaccel gets --instances too; auto: its default layout picks (workers, instances).")
    ap.add_argument("--kind", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--target", default="cpu", help="onnxaccel's target for serve and the in-process reference.")
    ap.add_argument("--serve-args", default="", help="More `serve` options (e.g. --queue-delay fixed).")
    ap.add_argument("--generators", default="perf_analyzer,loadtest",
                    help="Load generators: loadtest and perf_analyzer over HTTP, perf_analyzer_grpc, "
                         "perf_analyzer_shm (system shared memory), perf_analyzer_grpc_shm.")
    ap.add_argument("--servers", default="triton,onnxaccel")
    ap.add_argument("--interval-ms", type=int, default=2000)
    ap.add_argument("--warmup-s", type=float, default=0.0,
                    help="Load each server this long (loadtest at each rows count and concurrency) before "
                         "measuring: a provider that searches per new batch size (ORT's CUDA EP, cuDNN) sees them.")
    ap.add_argument("--stability", type=int, default=10,
                    help="perf_analyzer's --stability-percentage (its default 10; a noisy 2-core machine needs more).")
    ap.add_argument("--grpc-channel-share", type=int, default=0,
                    help="perf_analyzer over gRPC: concurrent clients per channel, i.e. per TCP connection "
                         "(TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT; 0: its default, 6).")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if (args.kind == "gpu") != (args.target.split(":", 1)[0].split("/", 1)[0] in ("cuda", "rocm", "migraphx",
                                                                                 "tensorrt")):
        ap.error(f"--kind {args.kind} with --target {args.target}: give both for the same device (Triton's "
                 "instance kind and onnxaccel's target), e.g. --kind gpu --target cuda:0.")
    name = args.name or args.model.stem
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    rows_list = [int(r) for r in args.rows.split(",")]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {"benchmark": "serve_vs_triton", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "commit": commit, "cpu": cpu_name(), "cores": os.cpu_count(), "model": str(args.model),
              "settings": {"max_batch": args.max_batch, "delay_us": args.delay_us, "instances": args.instances,
                           "serve_instances": args.serve_instances,
                           "kind": args.kind, "target": args.target, "serve_args": args.serve_args,
                           "generators": args.generators, "triton_config": args.triton_config,
                           "interval_ms": args.interval_ms, "warmup_s": args.warmup_s,
                           "stability_percentage": args.stability,
                           "grpc_channel_share": args.grpc_channel_share or 6}, "servers": {}}
    result["in_process"] = in_process(args.model, args.target, args.max_batch)
    generators = args.generators.split(",")
    with tempfile.TemporaryDirectory(prefix="serve-vs-triton-") as tmp:
        tmp = Path(tmp)
        model = tmp / f"{name}.onnx"
        shutil.copy(args.model, model)
        for server in args.servers.split(","):
            log = tmp / f"{server}.log"
            if server == "triton":
                proc, url, grpc = start_triton(args, triton_repo(tmp / "repo", args.model, name, args), log)
            else:
                proc, url, grpc = start_serve(args, model, log)
            try:
                ready = wait_ready(url, proc, 300)
                for rows in rows_list if args.warmup_s else ():  # every batch size the batcher will form, seen
                    for c in concurrencies:
                        loadtest(url, name, rows, c, args.warmup_s / len(rows_list) / len(concurrencies))
                cells = {}
                for generator in generators:
                    for rows in rows_list:
                        for c in concurrencies:
                            account = CellAccount(url, name, proc.pid)
                            cell = account.finish(
                                perf_analyzer(url, name, rows, c, args, tmp / "pa.csv", generator, grpc)
                                if generator in PERF_VARIANTS else
                                loadtest(url, name, rows, c, args.interval_ms / 1e3 * 3))
                            cells[f"{generator}-b{rows}-c{c}"] = cell
                            print(f"{server:9} {generator:13} rows {rows} c{c:<4} {json.dumps(cell)}", flush=True)
                policy = "fixed (Triton's dynamic batcher)" if server == "triton" else queue_delay(url, name)
                result["servers"][server] = {"ready_s": round(ready, 2), "queue_delay": policy, "cells": cells}
            finally:
                stop(proc)
                text = log.read_text(errors="replace")  # the head says the layout a server chose
                result["servers"].setdefault(server, {}).update(log_head=text[:3000], log_tail=text[-1500:])
            if args.out:
                args.out.write_text(json.dumps(result, indent=1))
    for generator in generators:
        print_table(result, generator, rows_list, concurrencies)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


def print_table(result: dict, generator: str, rows_list: list[int], concurrencies: list[int]) -> None:
    servers = result["servers"]
    print(f"\n{generator}: {result['cpu']} ({result['cores']} cores), {result['model']}, {result['commit']}")
    print("ready: " + ", ".join(f"{s} {v.get('ready_s')} s" for s, v in servers.items()))
    print("queue delay: " + ", ".join(f"{s} {v.get('queue_delay')}" for s, v in servers.items()))
    ref = result["in_process"]
    print(f"in-process ({ref['target']}, IO binding, max batch): {ref['rows_per_s']:,.0f} rows/s")
    print(f"{'rows':>4} {'conc':>4} | {'triton inf/s':>12} {'p50/p99 ms':>11} | {'onnxaccel inf/s':>15} "
          f"{'p50/p99 ms':>11} | {'ratio':>5}")
    for rows in rows_list:
        for c in concurrencies:
            key = f"{generator}-b{rows}-c{c}"
            t, o = (servers.get(s, {}).get("cells", {}).get(key, {}) for s in ("triton", "onnxaccel"))

            def fmt(cell):
                if "infer_per_s" not in cell:
                    return f"{'error' if cell else '-':>12} {'':>11}"
                return f"{cell['infer_per_s']:>12,.0f} {cell['p50_us'] / 1e3:>5.2f}/{cell['p99_us'] / 1e3:<5.2f}"
            ratio = (f"{o['infer_per_s'] / t['infer_per_s']:.2f}" if "infer_per_s" in o and "infer_per_s" in t
                     else "-")
            print(f"{rows:>4} {c:>4} | {fmt(t)} | {fmt(o):>27} | {ratio:>5}")
    goals(result, generator, rows_list, concurrencies)


def goals(result: dict, generator: str, rows_list: list[int], concurrencies: list[int]) -> None:
    """The two serving goals that need no Triton figure: onnxaccel's share of the in-process rows/s at the highest
    concurrency, and its time outside the model process at concurrency 1 (perf_analyzer's client send/receive:
    everything but the server's queue and compute)."""
    cells = result["servers"].get("onnxaccel", {}).get("cells", {})
    ref = result["in_process"]["rows_per_s"]
    top = max(concurrencies)
    for rows in rows_list:
        cell = cells.get(f"{generator}-b{rows}-c{top}", {})
        parts = [f"rows {rows}: c{top} {cell['infer_per_s'] / ref:.1%} of in-process" if "infer_per_s" in cell
                 else f"rows {rows}: c{top} -"]
        first = cells.get(f"{generator}-b{rows}-c1", {})
        if "client_send_recv_us" in first:
            parts.append(f"outside the model process at c1 {first['client_send_recv_us'] / 1e3:.2f} ms")
        print("onnxaccel " + ", ".join(parts))


if __name__ == "__main__":
    main()
