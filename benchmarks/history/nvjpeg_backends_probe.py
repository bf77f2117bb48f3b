"""Issue 22, sixth session: which nvJPEG path keeps its rate beside a busy GPU. torch and nvImageCodec only (no
ONNX Runtime): the product's NvjpegDecoder (prepost/decode.py) in each configuration, over the same JPEGs,

- ``waits``: one batch decoded right after a 0.1 s kernel (torch.cuda._sleep) was queued on another stream of
  the same context: a decode that takes >= 0.1 s waits for other streams' work (a device-wide synchronisation,
  e.g. cudaFree), which in `batch` would serialise it with the model's runs;
- ``alone``: images/s, batches of --batch, decode phase and resize phase separately;
- ``beside a model``: the same while a thread replays a CUDA graph of torchvision's ResNet-50 (FP16,
  channels-last, batch 64) back to back on its own stream (the model's images/s alone and beside the decoder
  are reported: what the decoder costs the model and the model the decoder);
- ``2 threads``: two decoders on two threads beside the model (as `batch` runs them).

Run on the GPU machine (gpu_issue22.sh made /tmp/i22/jpegs). Prints one line per case; --out writes JSON.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

#: name -> (library, backends, CPU threads, options, stream priority, geometry)
CONFIGS = {
    "torchvision": ("torchvision", (), 0, "", 0, "matmul"),
    "torchvision_groups": ("torchvision", (), 0, "", 0, "groups"),
    "nic_all": ("nvimgcodec", (), 0, "", 0, "matmul"),
    "nic_all_groups": ("nvimgcodec", (), 0, "", 0, "groups"),
    "nic_hw": ("nvimgcodec", ("hw",), 0, "", 0, "matmul"),
    "nic_t2": ("nvimgcodec", (), 2, "", 0, "matmul"),
}


def make(name: str):
    from onnxaccel.inputs_files import ImagePreprocess
    from onnxaccel.prepost.decode import NvjpegDecoder

    library, backends, threads, options, priority, geometry = CONFIGS[name]
    cls = type(f"Probe_{name}", (NvjpegDecoder,), {"LIBRARY": library, "BACKENDS": backends,
                                                   "CPU_THREADS": threads, "OPTIONS": options,
                                                   "STREAM_PRIORITY": priority, "GEOMETRY": geometry})
    return cls(224, 224, ImagePreprocess(preset="imagenet"))


def run(decoder, files, batch) -> dict:
    decoder.phases = dict.fromkeys(decoder.phases, 0)
    start = time.perf_counter()
    bad = 0
    for s in range(0, len(files), batch):
        _, b = decoder.decode_device(files[s:s + batch])
        bad += len(b)
    wall = time.perf_counter() - start
    return {"img_s": round(len(files) / wall), "bad": bad,
            **{k: round(v, 3) for k, v in decoder.phases.items() if k != "images"}}


def fallback_check(files: list[str]) -> dict:
    """The hardware-only decoder on baseline and progressive JPEGs (the engine takes baseline only): every file
    decoded (progressive ones by the every-backend fallback), pixels as the every-backend decoder's."""
    import tempfile

    import numpy as np
    from PIL import Image

    folder = Path(tempfile.mkdtemp())
    mixed = []
    for k, f in enumerate(files):
        target = folder / f"{k}-{'progressive' if k % 2 else 'baseline'}.jpg"
        Image.open(f).convert("RGB").save(target, "JPEG", quality=85, progressive=bool(k % 2))
        mixed.append(str(target))
    hw, every = make("nic_hw"), make("nic_all")
    a, bad_a = hw.decode_device(mixed)
    b, bad_b = every.decode_device(mixed)
    diff = (a.int() - b.int()).abs()
    return {"files": len(mixed), "bad_hw_only": bad_a, "bad_every": bad_b, "fallback_used": hw._fallback is not None,
            "max_abs_diff": int(diff.max()), "mean_abs_diff": float(diff.float().mean()),
            "ok": not bad_a and hw._fallback is not None and int(np.asarray(diff.max().cpu())) <= 8}


def geometry_check(files: list[str]) -> dict:
    """The batched matrix geometry against the per-size F.interpolate one on the same decoded photographs."""
    out = {}
    for library in ("nic", "torchvision"):
        a, _ = make(f"{'nic_all' if library == 'nic' else 'torchvision'}").decode_device(files)
        b, _ = make(f"{'nic_all' if library == 'nic' else 'torchvision'}_groups").decode_device(files)
        diff = (a.int() - b.int()).abs()
        out[library] = {"images": len(files), "max_abs_diff": int(diff.max()),
                        "mean_abs_diff": float(diff.float().mean()), "share_over_1": float((diff > 1).float().mean())}
    return out


class Model(threading.Thread):
    """torchvision ResNet-50, FP16 channels-last, batch 64, one CUDA graph replayed back to back on its own
    stream with a host wait per replay (as ONNX Runtime's run does)."""

    def __init__(self):
        super().__init__(daemon=True)
        import torch
        import torchvision

        self.torch = torch
        net = torchvision.models.resnet50().cuda().half().eval().to(memory_format=torch.channels_last)
        self.x = torch.randn(64, 3, 224, 224, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
        self.stream = torch.cuda.Stream()
        with torch.no_grad(), torch.cuda.stream(self.stream):
            for _ in range(3):
                net(self.x)
            self.stream.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=self.stream):
                self.y = net(self.x)
        self.go = threading.Event()
        self.stop = False
        self.count = 0

    def run(self):
        with self.torch.cuda.stream(self.stream):
            while not self.stop:
                self.go.wait()
                self.graph.replay()
                self.stream.synchronize()
                self.count += 64

    def rate(self, seconds: float) -> float:
        before, start = self.count, time.perf_counter()
        time.sleep(seconds)
        return (self.count - before) / (time.perf_counter() - start)


def main():
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--jpegs", default="/tmp/i22/jpegs")
    p.add_argument("--count", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--out", default=None)
    a = p.parse_args()
    files = sorted(str(f) for f in Path(a.jpegs).glob("*.jpg"))[:a.count]
    results: dict = {"files": len(files), "batch": a.batch}
    results["fallback_check"] = fallback_check(files[:4])
    print("fallback check:", json.dumps(results["fallback_check"]), flush=True)
    results["geometry_check"] = geometry_check(files[:256])
    print("geometry check:", json.dumps(results["geometry_check"]), flush=True)
    model = Model()
    model.start()
    model.go.set()
    results["model_alone_img_s"] = round(model.rate(2.0))
    model.go.clear()
    time.sleep(0.1)
    print(f"model alone: {results['model_alone_img_s']:,} img/s", flush=True)
    cycles = int(torch.cuda.get_device_properties(0).clock_rate * 1000 * 0.1) if hasattr(
        torch.cuda.get_device_properties(0), "clock_rate") else 200_000_000
    other = torch.cuda.Stream()
    for name in a.configs.split(","):
        row: dict = {}
        try:
            dec = make(name)
            run(dec, files[:a.batch * 2], a.batch)  # warm: first calls allocate
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dec.decode_device(files[:a.batch])
            quiet = time.perf_counter() - t0
            with torch.cuda.stream(other):
                torch.cuda._sleep(cycles)
            t0 = time.perf_counter()
            dec.decode_device(files[:a.batch])
            busy = time.perf_counter() - t0
            torch.cuda.synchronize()
            row["one_batch_ms"] = round(1000 * quiet, 2)
            row["one_batch_after_0.1s_kernel_ms"] = round(1000 * busy, 2)
            row["alone"] = run(dec, files, a.batch)
            model.go.set()
            time.sleep(0.3)
            before = model.count
            t0 = time.perf_counter()
            row["beside_model"] = run(dec, files, a.batch)
            row["beside_model"]["model_img_s"] = round((model.count - before) / (time.perf_counter() - t0))
            dec2 = make(name)
            run(dec2, files[:a.batch], a.batch)
            out: list = [None, None]
            half = len(files) // 2
            threads = [threading.Thread(target=lambda k, d: out.__setitem__(k, run(d, files[k * half:(k + 1) * half],
                                                                                  a.batch)), args=(k, d))
                       for k, d in enumerate((dec, dec2))]
            before, t0 = model.count, time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            row["two_threads_beside_model"] = {"img_s": round(len(files) / wall),
                                               "model_img_s": round((model.count - before) / wall), "each": out}
            model.go.clear()
            time.sleep(0.1)
        except Exception as exc:  # one configuration that cannot run must not cost the others
            model.go.clear()
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        results[name] = row
        al, bm, tt = row.get("alone", {}), row.get("beside_model", {}), row.get("two_threads_beside_model", {})
        print(f"{name}: batch {row.get('one_batch_ms')} ms, after 0.1 s kernel "
              f"{row.get('one_batch_after_0.1s_kernel_ms')} ms | alone {al.get('img_s')}/s (decode {al.get('decode_s')} s, resize {al.get('resize_s')} s, read "
              f"{al.get('read_s')} s) | beside model {bm.get('img_s')}/s (decode {bm.get('decode_s')}, resize "
              f"{bm.get('resize_s')}), model {bm.get('model_img_s')}/s | 2 threads {tt.get('img_s')}/s, model "
              f"{tt.get('model_img_s')}/s | bad {al.get('bad')} {row.get('error', '')}", flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps(results, indent=2))
    model.stop = True
    model.go.set()


if __name__ == "__main__":
    main()
