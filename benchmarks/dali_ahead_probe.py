"""DALI's decoder alone (prepost/dali.py DaliDecoder) with batches submitted ahead against one at a time: images/s
over the same JPEGs at batch 64 (issue 22, seventh session). Needs a GPU, torch and DALI; prints one line per
setting and writes --out JSON."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from onnxaccel.inputs_files import ImagePreprocess
from onnxaccel.prepost.dali import DaliDecoder


def rate(files: list[str], batch: int, ahead: int, threads: int) -> dict:
    DaliDecoder.AHEAD, DaliDecoder.CPU_THREADS = ahead, threads
    dec = DaliDecoder(224, 224, ImagePreprocess(preset="imagenet"))
    dec.decode_device(files[:batch])
    batches = [files[s:s + batch] for s in range(0, len(files), batch)]
    start = time.perf_counter()
    tickets = []
    for paths in batches:
        tickets.append(dec.submit(paths))
        if len(tickets) >= max(1, ahead):
            dec.collect(tickets.pop(0))
    for t in tickets:
        dec.collect(t)
    seconds = time.perf_counter() - start
    return {"ahead": ahead, "cpu_threads": threads, "images": len(files), "img_s": len(files) / seconds,
            "fallback_images": dec.fallback_images}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--folder", default="/tmp/i22/jpegs")
    p.add_argument("--count", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--settings", default="1:4,3:4,3:8,4:8")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    files = sorted(str(f) for f in Path(a.folder).glob("*.jpg"))[:a.count]
    results = []
    for setting in a.settings.split(","):
        ahead, threads = (int(x) for x in setting.split(":"))
        r = rate(files, a.batch, ahead, threads)
        results.append(r)
        print(f"DALI alone, {ahead} ahead, {threads} CPU threads: {r['img_s']:,.0f} images/s", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
