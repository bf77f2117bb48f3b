"""Why a served model's run is slower than the same run in process: Session.run of a served instance under the
conditions the server creates, one at a time.

On the H200 (2026-12-02) the server's batches of ResNet-50 FP16 took ~180 ms per run under load whatever their
size, against 14 ms in process, and py-spy showed the run thread inside cuDNN's engine heuristics
(cudnnBackendGetAttribute -> EngineHeuristics) on every sample. This probe separates the suspects:

1. the thread: models are loaded (and warmed up) in one thread and run in another (the batcher's pool);
2. the input buffer: a fresh padded buffer per batch vs the same one;
3. other threads allocating request-sized buffers meanwhile (the event loop reading 600 kB bodies);
4. the batch size changing between runs (buckets 8 and 16 alternating);
5. (second session) at batch 64: the join into the instance's reused, page-locked buffer with GIL-holding
   copies against numpy's copies into a fresh array, quiet and with a thread running Python meanwhile (as
   the event loop does), at the server's GIL switch interval; and the run alone from pinned vs pageable input.

Usage: python benchmarks/history/serve_session_probe.py [--model zoo:resnet50] [--target cuda:0] [--precision fp16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.repository import load_instance


def timed(fn, n: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:resnet50")
    parser.add_argument("--target", default="cuda:0")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    config = ModelConfig(name="m", source=args.model, target=args.target, precision=args.precision, max_batch=64,
                         arena_extend_strategy="kSameAsRequested")
    loader = ThreadPoolExecutor(1, thread_name_prefix="load")
    instance = loader.submit(load_instance, config).result()  # as the server: loaded and warmed in another thread
    spec = instance.model.inputs[0]
    row = np.random.default_rng(0).random((1, *instance.model.input_shapes[spec.name][1:]), dtype=np.float32)
    parts8 = [{spec.name: row.copy()} for _ in range(8)]
    parts16 = [{spec.name: row.copy()} for _ in range(16)]
    fixed8 = {spec.name: np.repeat(row, 8, axis=0)}
    results = {"buckets": list(instance.buckets), "target": str(instance.runners[0].target)}

    def in_thread(pool, fn):
        return lambda: pool.submit(fn).result()

    results["main thread, same buffer, b8"] = timed(lambda: instance.pool._execute(0, fixed8), args.runs)
    results["main thread, joined (fresh buffer), b8"] = timed(lambda: instance.execute_joined(0, parts8), args.runs)
    results["load thread, joined, b8"] = timed(in_thread(loader, lambda: instance.execute_joined(0, parts8)), args.runs)
    runner_pool = ThreadPoolExecutor(1, thread_name_prefix="run")
    results["new run thread, joined, b8"] = timed(in_thread(runner_pool, lambda: instance.execute_joined(0, parts8)),
                                                  args.runs)
    results["new run thread, same buffer, b8"] = timed(in_thread(runner_pool, lambda: instance.pool._execute(0, fixed8)),
                                                       args.runs)
    stop = threading.Event()

    def churn() -> None:  # the event loop's work: request bodies of one image come and go
        while not stop.is_set():
            bodies = [bytes(bytearray(row.nbytes)) for _ in range(16)]
            del bodies

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    results["run thread + allocating thread, joined, b8"] = timed(
        in_thread(runner_pool, lambda: instance.execute_joined(0, parts8)), args.runs)
    stop.set()
    churner.join()
    flip = iter(range(10**9))
    results["run thread, b8 and b16 alternating"] = timed(in_thread(runner_pool, lambda: instance.execute_joined(
        0, parts8 if next(flip) % 2 else parts16)), args.runs)
    results["run thread, b8 again after alternating"] = timed(
        in_thread(runner_pool, lambda: instance.execute_joined(0, parts8)), args.runs)

    # 5. batch 64: joins and host memory, with the server's switch interval.
    sys.setswitchinterval(0.0005)
    results["host memory"] = instance.pool.hosts[0].describe()
    parts64 = [{spec.name: row.copy()} for _ in range(64)]
    pageable64 = {spec.name: np.repeat(row, 64, axis=0)}
    staged64 = {spec.name: instance.pool.buffer(0, spec.name, (64, *row.shape[1:]), row.dtype)}
    staged64[spec.name][...] = pageable64[spec.name]

    def numpy_join() -> None:  # the first session's join: a fresh array, numpy copies
        fresh = np.empty((64, *row.shape[1:]), dtype=row.dtype)
        np.concatenate([p[spec.name] for p in parts64], axis=0, out=fresh)
        instance.pool._execute(0, {spec.name: fresh})

    busy = threading.Event()

    def python_loop() -> None:  # the event loop's kind of work: Python bytecode, the GIL held
        x = 0
        while not busy.is_set():
            for i in range(1000):
                x += i

    for label in ("quiet", "busy Python thread"):
        spinner = None
        if label != "quiet":
            spinner = threading.Thread(target=python_loop, daemon=True)
            spinner.start()
        results[f"b64, {label}: run, pinned input"] = timed(
            in_thread(runner_pool, lambda: instance.pool._execute(0, staged64)), args.runs)
        results[f"b64, {label}: run, pageable input"] = timed(
            in_thread(runner_pool, lambda: instance.pool._execute(0, pageable64)), args.runs)
        results[f"b64, {label}: join (reused buffer, GIL-holding copies) + run"] = timed(
            in_thread(runner_pool, lambda: instance.execute_joined(0, parts64)), args.runs)
        results[f"b64, {label}: join (fresh array, numpy copies) + run"] = timed(
            in_thread(runner_pool, numpy_join), args.runs)
        if spinner is not None:
            busy.set()
            spinner.join()
    instance.close()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
