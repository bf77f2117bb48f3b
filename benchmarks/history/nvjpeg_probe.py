"""Where nvJPEG loses its rate inside `batch` (issue 22): the same NvjpegDecoder over the same files, timed per
phase, (1) in this process, (2) in DecodePool's spawned GPU process fed as the pipeline feeds it (units of
``--batch``, three in flight), (3) as (2) while another process keeps the GPU busy with `bench` (ResNet-50).
Run on the GPU machine after gpu_issue22.sh made /tmp/i22/jpegs; prints one line per case."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def in_process(files, batch):
    from onnxaccel.inputs_files import ImagePreprocess
    from onnxaccel.prepost.decode import NvjpegDecoder

    dec = NvjpegDecoder(224, 224, ImagePreprocess(preset="imagenet"))
    dec.decode(files[:batch])
    dec.phases = dict.fromkeys(dec.phases, 0)
    start = time.perf_counter()
    for s in range(0, len(files), batch):
        dec.decode(files[s:s + batch])
    return len(files) / (time.perf_counter() - start), dec.phases


def in_pool(files, batch, depth=3):
    from onnxaccel.inputs_files import ImagePreprocess
    from onnxaccel.prepost.decode import DecodePool

    pool = DecodePool(depth + 2, batch, 224, 224, ImagePreprocess(preset="imagenet"), workers=0, gpu=0)
    try:
        for f in pool.start():
            f.result()
        pool.submit_gpu(0, 0, files[:batch]).result()
        pool.gpu_phases()
        before = pool.gpu_phases()
        start = time.perf_counter()
        pending = []
        for i, s in enumerate(range(0, len(files), batch)):
            pending.append(pool.submit_gpu(i % (depth + 2), 0, files[s:s + batch]))
            if len(pending) >= depth:
                pending.pop(0).result()
        for f in pending:
            f.result()
        rate = len(files) / (time.perf_counter() - start)
        after = pool.gpu_phases()
        return rate, {k: after[k] - before.get(k, 0) for k in after}
    finally:
        pool.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--jpegs", default="/tmp/i22/jpegs")
    p.add_argument("--count", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--target", default="cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1&enable_cuda_graph=1")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    files = sorted(str(f) for f in Path(a.jpegs).glob("*.jpg"))[:a.count]
    results = {}
    for name, fn in (("in_process", in_process), ("spawned_pool", in_pool), ("in_process_again", in_process)):
        rate, phases = fn(files, a.batch)
        results[name] = {"img_s": rate, "phases": phases}
        print(name, f"{rate:,.0f} img/s", json.dumps({k: round(v, 3) for k, v in phases.items()}), flush=True)
    load = subprocess.Popen([sys.executable, "-m", "onnxaccel.cli.main", "bench", "zoo:resnet50", "-t", a.target,
                             "-b", "64", "--iobinding", "on", "--graph", "on", "--runs", "200000", "--warmup", "10"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(float(os.environ.get("PROBE_LOAD_WAIT", "40")))  # model load, FP16 (cached), capture
        for name, fn in (("spawned_pool_gpu_busy", in_pool), ("in_process_gpu_busy", in_process)):
            rate, phases = fn(files, a.batch)
            results[name] = {"img_s": rate, "phases": phases, "load_alive": load.poll() is None}
            print(name, f"{rate:,.0f} img/s", json.dumps({k: round(v, 3) for k, v in phases.items()}),
                  "load running" if load.poll() is None else "load ended", flush=True)
    finally:
        load.kill()
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
