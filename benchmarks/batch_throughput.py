"""`batch` throughput in-process and on Ray Data (1..N actors/GPUs) for the same data, and `serve --ray` with
1..N replicas under the load generator, side by side in one run.

1. Probe: the model on the target in this process for a few seconds -> rows/s of one worker (r1).
2. Data: a few real .npy shards (uint8 rows, cast to the model's float input as `batch` does), and for each
   configuration a folder of symlinks to them, sized so the configuration runs about --seconds at r1 x workers
   (symlinked shards are distinct shards with their own outputs, read from the page cache).
3. Batch: in-process (one worker), then Ray Data with each --gpus count (GPU targets: one actor per GPU) or
   --workers count (CPU). rows/s = rows / (wall - startup), startup = cluster, actors and compile until the
   first results came back. "wall ms/batch" = steady seconds / model calls; "worker ms/batch" = the workers'
   own read + run seconds per call. With --overhead (an Identity model) the wall figure is the runner's own
   cost per batch: scheduling, object store, driver, parquet writes.
4. Serve (--serve): `serve --ray` with each replica count, `loadtest` at --concurrency for --serve-seconds
   (binary tensors over HTTP, --request-batch rows per request), inferences/s.

Issue 10 (2 GPUs, one call):
  python benchmarks/batch_throughput.py --target cuda/fp16 --model zoo:resnet50 --gpus 1,2 --seconds 60
CPU, here:
  python benchmarks/batch_throughput.py --target cpu --model zoo:squeezenet --workers 2 --seconds 20
  python benchmarks/batch_throughput.py --target cpu --overhead --seconds 20   # a ~zero-compute model
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxaccel.model import load_model
from onnxaccel.scale import BatchJob, run_batch
from onnxaccel.scale.cluster import ray_cluster
from onnxaccel.scale.datasets import Unit, open_dataset
from onnxaccel.scale.worker import BatchWorker, WorkerSpec
from onnxaccel.target import parse_target


def overhead_model(path: Path) -> str:
    """x[batch, 64] -> Identity: the runner's own cost per batch, with next to no model compute."""
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def base_shards(model_source: str, batch: int, folder: Path, rows_per_shard: int, count: int) -> list[Path]:
    model = load_model(model_source).bind(batch=batch)
    spec = model.inputs[0]
    row = tuple(model.input_shapes[spec.name][1:])
    dtype = np.uint8 if np.dtype(spec.dtype).kind == "f" else np.dtype(spec.dtype)
    folder = folder / f"{Path(model.path).stem}-{'x'.join(map(str, row))}-{np.dtype(dtype).name}-{rows_per_shard}"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        path = folder / f"base-{i}.npy"
        if not path.exists():
            np.save(path, rng.integers(0, 255, (rows_per_shard, *row)).astype(dtype))
        paths.append(path)
    return paths


def linked_dataset(folder: Path, bases: list[Path], rows: int, rows_per_shard: int) -> Path:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for i in range(max(1, -(-rows // rows_per_shard))):
        (folder / f"shard-{i:05d}.npy").symlink_to(bases[i % len(bases)].resolve())
    return folder


def probe(model: str, target: str, batch: int, bases: list[Path], seconds: float) -> float:
    """Rows/s of one worker on this target (read + run, numpy in/out), measured for ``seconds``."""
    data = open_dataset(bases[0].parent, load_model(model).bind(batch=batch))
    worker = BatchWorker(WorkerSpec(model, target, batch, data))
    try:
        rows_in_shard = data.shards[0].rows
        worker.run(Unit(0, 0, min(batch, rows_in_shard)))  # warm-up
        rows, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            s = (rows // batch * batch) % max(1, rows_in_shard - batch + 1)
            rows += worker.run(Unit(0, s, s + min(batch, rows_in_shard))).unit.rows
        return rows / (time.perf_counter() - start)
    finally:
        worker.close()


def batch_config(name: str, job: BatchJob) -> dict:
    report = run_batch(job)
    units = sum(w.units for w in report.workers)
    busy = sum(w.read_s + w.run_s for w in report.workers)
    workers = max(1, len({w.name for w in report.workers}) if job.ray else 1)
    pool = (report.ray or {}).get("pool", {}).get("workers", 1)
    return {"config": name, "rows": report.rows_done, "units": units, "wall_s": report.wall_s,
            "startup_s": report.startup_s, "rows_per_s": report.rows_per_s,
            "wall_ms_per_batch": report.steady_s / units * 1e3 if units else None,
            "worker_ms_per_batch": busy / units * 1e3 if units else None, "actors": pool, "actors_seen": workers,
            "report": report.to_dict()}


def serve_config(args, replicas: int, batch: int) -> dict:
    from onnxaccel.scale import serve_ray
    from onnxaccel.serve.config import ServerConfig
    from onnxaccel.loadtest import LoadtestConfig, run_loadtest

    defaults = {"target": args.target, "max_batch": batch, "max_queue_delay_ms": 2.0, "max_queue": 1024}
    start = time.perf_counter()
    server = serve_ray.start(args.model, defaults, ServerConfig(http_port=0, grpc_port=None), address=args.ray,
                             replicas=replicas, cpus_per_replica=1.0)
    startup = time.perf_counter() - start
    try:
        name = args.model.removeprefix("zoo:") if args.model.startswith("zoo:") else Path(args.model).stem
        report = run_loadtest(LoadtestConfig(url=server.url, model=name, binary=True, concurrency=(args.concurrency,),
                                             duration_s=args.serve_seconds, warmup_s=min(5.0, args.serve_seconds / 4),
                                             batch=args.request_batch, workers=args.load_workers))
    finally:
        server.stop()
    level = report.levels[0]
    return {"config": f"serve --ray, {replicas} replica(s)", "replicas": replicas, "startup_s": startup,
            "inferences_per_s": level.inferences_per_s, "requests": level.requests, "errors": level.errors,
            "p50_ms": level.latency.p50 if level.latency else None,
            "p99_ms": level.latency.p99 if level.latency else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="zoo:squeezenet")
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--batch", type=int, default=None, help="rows per model call (default 8 CPU, 64 GPU)")
    parser.add_argument("--gpus", default=None, help="GPU counts to run on Ray, e.g. 1,2 (GPU targets)")
    parser.add_argument("--workers", default=None, help="actor counts for a CPU target, e.g. 1,2 (default: CPUs)")
    parser.add_argument("--seconds", type=float, default=20.0, help="about how long each batch configuration runs")
    parser.add_argument("--probe-seconds", type=float, default=5.0)
    parser.add_argument("--rows-per-shard", type=int, default=None, help="default 8 batches")
    parser.add_argument("--max-units", type=int, default=20000,
                        help="cap on model calls per configuration (a fast model would otherwise need millions)")
    parser.add_argument("--ray", default="auto", help="auto, local or a cluster address")
    parser.add_argument("--units-per-task", type=int, default=None, help="model calls per Ray task (default: auto)")
    parser.add_argument("--no-in-process", action="store_true")
    parser.add_argument("--overhead", action="store_true", help="use an Identity model: the runners' own cost")
    parser.add_argument("--serve", action=argparse.BooleanOptionalAction, default=None,
                        help="also `serve --ray` with each replica count (default: on for GPU targets)")
    parser.add_argument("--serve-seconds", type=float, default=None, help="load per replica count (default seconds/2)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--request-batch", type=int, default=None,
                        help="rows per serve request (default 8 on GPUs: one request per image would measure Ray "
                        "Serve's proxy, not the GPUs; 1 on CPU)")
    parser.add_argument("--load-workers", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path("out/batch_throughput"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    target = parse_target(args.target)
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.overhead:
        args.model = overhead_model(args.workdir / "identity.onnx")
    batch = args.batch or (64 if target.is_gpu else 8)
    rows_per_shard = args.rows_per_shard or 8 * batch
    counts = [int(c) for c in (args.gpus or args.workers or "").split(",") if c.strip()]
    serve = args.serve if args.serve is not None else target.is_gpu
    args.serve_seconds = args.serve_seconds or args.seconds / 2
    args.request_batch = args.request_batch or (8 if target.is_gpu else 1)
    started = datetime.now(timezone.utc)

    bases = base_shards(args.model, batch, args.workdir / "base", rows_per_shard, 4)
    r1 = probe(args.model, str(target), batch, bases, args.probe_seconds)
    print(f"probe: {r1:.1f} rows/s with one worker on {target} (batch {batch})", file=sys.stderr)
    results, serving = [], []
    if not args.no_in_process:
        data = linked_dataset(args.workdir / "data-in-process", bases, _rows(args, r1, 1, batch), rows_per_shard)
        results.append(batch_config("in-process, 1 worker", BatchJob(
            args.model, str(data), str(args.workdir / "out-in-process"), target=target, batch=batch, overwrite=True)))
        _show(results[-1])
    with ray_cluster(args.ray) as cluster:
        counts = counts or [int(cluster.gpus) if target.is_gpu else int(cluster.cpus)]
        for n in counts:
            data = linked_dataset(args.workdir / f"data-ray-{n}", bases, _rows(args, r1, n, batch), rows_per_shard)
            label = f"ray, {n} {'GPU' if target.is_gpu else 'CPU actor'}{'s' if n > 1 else ''}"
            results.append(batch_config(label, BatchJob(
                args.model, str(data), str(args.workdir / f"out-ray-{n}"), target=target, batch=batch, ray=args.ray,
                workers=n, units_per_task=args.units_per_task, overwrite=True)))
            _show(results[-1])
        if serve:
            for n in counts:
                try:
                    serving.append(serve_config(args, n, batch))
                except Exception as exc:  # noqa: BLE001 - the batch figures above stand; the error is reported
                    serving.append({"config": f"serve --ray, {n} replica(s)", "replicas": n,
                                    "error": f"{type(exc).__name__}: {exc}"})
                    print(f"serve --ray with {n} replica(s) failed: {serving[-1]['error']}", file=sys.stderr)
                    continue
                print(f"{serving[-1]['config']}: {serving[-1]['inferences_per_s']:.1f} inferences/s", file=sys.stderr)
        cluster_info = cluster.to_dict()

    summary = {
        "schema": "onnxaccel.bench.batch-throughput/1", "date": started.isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "command": "python " + " ".join(sys.argv), "model": args.model, "target": str(target), "batch": batch,
        "units_per_task": args.units_per_task or "auto", "probe_rows_per_s": r1, "cluster": cluster_info,
        "batch_runs": results, "serve_runs": serving,
        "scaling": _scaling(results, serving),
    }
    _table(summary)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2, default=str) + "\n")


def _rows(args, r1: float, workers: int, batch: int) -> int:
    """Rows for about --seconds at r1 rows/s per worker, at most --max-units model calls."""
    return max(batch, min(int(r1 * workers * args.seconds), args.max_units * batch))


def _scaling(results: list[dict], serving: list[dict]) -> dict:
    ray = [r for r in results if r["config"].startswith("ray")]
    out = {}
    if len(ray) >= 2:
        out["batch_ratio_last_vs_first"] = ray[-1]["rows_per_s"] / ray[0]["rows_per_s"]
    serving = [s for s in serving if "error" not in s]
    if len(serving) >= 2:
        out["serve_ratio_last_vs_first"] = serving[-1]["inferences_per_s"] / serving[0]["inferences_per_s"]
    return out


def _show(row: dict) -> None:
    print(f"{row['config']}: {row['rows_per_s']:.1f} rows/s, {row['rows']} rows, startup {row['startup_s']:.1f} s, "
          f"{row['wall_ms_per_batch']:.2f} ms/batch wall", file=sys.stderr)


def _table(summary: dict) -> None:
    print(f"{summary['model']} on {summary['target']}, batch {summary['batch']} -- {summary['date']}, "
          f"{summary['machine']['host']}")
    print(f"{'configuration':<28}{'rows/s':>12}{'rows':>9}{'startup s':>11}{'wall ms/batch':>15}"
          f"{'worker ms/batch':>17}")
    for r in summary["batch_runs"]:
        print(f"{r['config']:<28}{r['rows_per_s']:>12.1f}{r['rows']:>9}{r['startup_s']:>11.1f}"
              f"{r['wall_ms_per_batch']:>15.2f}{r['worker_ms_per_batch']:>17.2f}")
    for s in summary["serve_runs"]:
        if "error" in s:
            print(f"{s['config']:<28} failed: {s['error']}")
            continue
        print(f"{s['config']:<28}{s['inferences_per_s']:>12.1f} inf/s  p50 {s['p50_ms'] or 0:.1f} ms  "
              f"p99 {s['p99_ms'] or 0:.1f} ms  errors {sum(s['errors'].values())}")
    for key, value in summary["scaling"].items():
        print(f"{key}: {value:.2f}x")
    print(f"command: {summary['command']}")


if __name__ == "__main__":
    main()
