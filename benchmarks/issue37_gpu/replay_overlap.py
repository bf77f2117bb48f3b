"""How several graph-replaying instances share one GPU: serve's run path (RunnerPool.run_rows: a direct copy
from page-locked rows into the bound input, the replay, the outputs back) on N instances side by side, model
only, and with the replays ordered one at a time in two ways.

Issue 37: at concurrency 256 the default serve (4 instances) reaches about 85 % of one session's model-only
rate, and its instances' replays take about four times one replay. This separates the device side from the
server: if N instances of this loop alone stay well under one session's model-only rate, the loss is on the
device side (concurrent replays, or all instances leaving the GPU at once), not in the front end.

Modes (each with N = --instances):
  model    the bound run alone, no copies (what `bench --instances N` times)
  copy     serve's path: copy in from page-locked rows, replay, outputs back (each instance its own stream)
  serial   copy, with the runs taking turns as serve --streams serial makes them (RunnerPool's RunTurns: a
           lock around the replay alone)
  shared   copy, with every instance's session on one CUDA stream (ORT's user_compute_stream): the replays
           queue on the GPU in launch order, the next one launched while the last still runs
``--host-ms`` adds a sleep per batch after the outputs (the model process's own turn: results out, next batch
in), for copy, serial and shared.

    source benchmarks/gpu_setup.sh
    python3 benchmarks/issue37_gpu/replay_overlap.py $M --batch 64 --instances 1,2,4 --host-ms 0,4 --duration 3
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np

from onnxaccel.engines.gpu_runtime import runtime_for
from onnxaccel.engines.hostmem import DeviceStream, pin, unpin
from onnxaccel.engines.pool import RunnerPool
from onnxaccel.engines.pool_io import RunTurns
from onnxaccel.pipeline import prepare
from onnxaccel.target import parse_target


def make_pool(prepared, count: int, batch: int) -> RunnerPool:
    pool = RunnerPool.build(prepared.new_runner, count, buckets=(batch,), graph=True, model=prepared.model,
                            name="overlap")
    pool.warm_up()
    return pool


def pinned_parts(model, count: int, batch: int, pinned: bool = True) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    parts = []
    for _ in range(count):
        part = {}
        for spec in model.inputs:
            shape = (batch, *model.input_shapes[spec.name][1:])
            value = rng.random(shape, dtype=np.float32).astype(np.dtype(spec.dtype))
            why = pin("cuda", value.ctypes.data, value.nbytes) if pinned else ""
            if why:
                raise SystemExit(f"cannot page-lock the rows: {why}")
            part[spec.name] = value
        parts.append(part)
    return parts


def timed(pool: RunnerPool, count: int, parts, batch: int, duration: float, host_ms: float, mode: str) -> dict:
    """Each of ``count`` instances runs back to back for ``duration`` s; rows/s over the wall time, phases."""
    calls = {i: pool.bound[(i, batch)].run for i in range(count)}  # model: the captured replay alone
    barrier = threading.Barrier(count + 1)
    stop = [0.0]
    sleep = host_ms / 1e3

    def loop(i: int) -> dict:
        for _ in range(3):
            calls[i]() if mode == "model" else pool.run_rows(i, [parts[i]])
        barrier.wait()
        n, phases = 0, {}
        while time.perf_counter() < stop[0]:
            if mode == "model":
                calls[i]()
            else:
                pool.run_rows(i, [parts[i]])
                for k, v in pool.phases[i].items():
                    phases[k] = phases.get(k, 0.0) + v
                if sleep:
                    time.sleep(sleep)
            n += 1
        return {"n": n, "end": time.perf_counter(), "phases": phases}

    futures = [pool.submit(i, loop, i) for i in range(count)]
    stop[0] = time.perf_counter() + 1e9
    barrier.wait()
    start = time.perf_counter()
    stop[0] = start + duration
    results = [f.result() for f in futures]
    wall = max(r["end"] for r in results) - start
    batches = sum(r["n"] for r in results)
    phases = {k: 1e3 * sum(r["phases"].get(k, 0.0) for r in results) / max(1, batches)
              for k in ("copy_in", "turn", "replay", "copy_out")}
    return {"mode": mode, "instances": count, "host_ms": host_ms, "batches": batches,
            "rows_per_s": batches * batch / wall, "phases_ms": phases}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--target", default="cuda:0?enable_cuda_graph=1")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--instances", default="1,2,4")
    p.add_argument("--host-ms", default="0,4")
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--modes", default="model,copy,serial,shared")
    p.add_argument("--json", default="")
    args = p.parse_args()
    counts = [int(c) for c in args.instances.split(",")]
    host = [float(h) for h in args.host_ms.split(",")]
    modes = args.modes.split(",")
    most = max(counts)
    rows = []
    built = time.perf_counter()
    target = parse_target(args.target)
    gpu = target.is_gpu  # a CPU target only tries the script out (no copies to a device, no stream)
    if not gpu:
        modes = [m for m in modes if m != "shared"]
    prepared = prepare(args.model, target, batch=args.batch)
    parts = pinned_parts(prepared.model, most, args.batch, pinned=gpu)
    print(f"model {args.model} batch {args.batch}; built in {time.perf_counter() - built:.1f} s", flush=True)

    def report(row):
        ph = row["phases_ms"]
        print(f"{row['mode']:>6} N={row['instances']} host {row['host_ms']:>3.0f} ms: {row['rows_per_s']:8,.0f} "
              f"rows/s  copy in {ph['copy_in']:5.2f} turn {ph['turn']:5.2f} replay {ph['replay']:6.2f} "
              f"out {ph['copy_out']:5.2f} ms",
              flush=True)
        rows.append(row)

    own = make_pool(prepared, most, args.batch) if {"model", "copy", "serial"} & set(modes) else None
    for count in counts:
        if "model" in modes:
            report(timed(own, count, parts, args.batch, args.duration, 0, "model"))
        if "copy" in modes:
            for h in host:
                report(timed(own, count, parts, args.batch, args.duration, h, "copy"))
    if "serial" in modes:
        own.turns = RunTurns(True)  # as serve --streams serial builds its pool
        for count in counts:
            if count > 1:
                for h in host:
                    report(timed(own, count, parts, args.batch, args.duration, h, "serial"))
    if own is not None:
        own.close()
    if "shared" in modes:
        try:  # the stream and the target as serve --streams shared makes them (serve/repository.py)
            stream = DeviceStream(runtime_for(target.device), target.device_id or 0).handle
            shared_target = target.with_options({target.spec.stream_option: str(stream)})
            sprep = prepare(args.model, shared_target, batch=args.batch)
            spool = make_pool(sprep, most, args.batch)
        except Exception as exc:  # noqa: BLE001 - an experiment: say why the mode did not run
            print(f"shared: could not build ({type(exc).__name__}: {str(exc)[:300]})", flush=True)
        else:
            for count in counts:
                if count > 1:
                    for h in host:
                        report(timed(spool, count, parts, args.batch, args.duration, h, "shared"))
            spool.close()
    for part in parts:
        for value in part.values():
            if gpu:
                unpin("cuda", value.ctypes.data)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "target": args.target, "batch": args.batch, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
