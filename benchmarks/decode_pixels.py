"""How close each GPU JPEG decoder's pixels are to the CPU's (Pillow / libjpeg-turbo), on the batch stage's
photographs: the whole decoded image (the decoder alone) and the preset's 224x224 input (the decoder and the
geometry, as `batch` feeds the model). Issue 22: the default GPU decoder was chosen by top-1 agreement on the zoo's
ResNet-50, whose weights are random (its top-1 is a near tie on most photographs), so this compares pixels.

    python3 benchmarks/decode_pixels.py --count 200 --out pixels.json   # on the GPU machine, after gpu_setup.sh

The photographs are batch_vs_bench.py's (made in --jpegs if that folder holds none).

Decoders: nvImageCodec (every backend, its default), torchvision.io.decode_jpeg on CUDA, DALI's mixed decoder (the
hardware decoder for 90 % of a batch) with and without jpeg_fancy_upsampling, and DALI's CUDA decoder only
(hw_decoder_load 0) with fancy upsampling; each missing library is reported, not fatal. Per decoder: mean and
largest |difference| in levels, PSNR (dB), and the share of values more than 2 levels off.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np


def stats(got: list[np.ndarray], want: list[np.ndarray]) -> dict:
    diffs = [np.abs(g.astype(np.int16) - w.astype(np.int16)) for g, w in zip(got, want)]
    if any(g.shape != w.shape for g, w in zip(got, want)):
        return {"error": "shapes differ", "shapes": [[list(g.shape), list(w.shape)] for g, w in zip(got, want)][:3]}
    flat = np.concatenate([d.ravel() for d in diffs])
    mse = float(np.mean(flat.astype(np.float64) ** 2))
    return {"mean_abs": round(float(flat.mean()), 4), "max_abs": int(flat.max()),
            "psnr_db": round(10 * math.log10(255 ** 2 / mse), 2) if mse else None,
            "share_over_2": round(float(np.mean(flat > 2)), 5),
            "worst_image_mean_abs": round(max(float(d.mean()) for d in diffs), 4)}


def pillow_full(paths):
    from PIL import Image

    return [np.asarray(Image.open(p).convert("RGB")) for p in paths]


def nvimgcodec_full(paths):
    import nvidia.nvimgcodec as nic

    dec = nic.Decoder()
    params = nic.DecodeParams(apply_exif_orientation=False, color_spec=nic.ColorSpec.SRGB, allow_any_depth=False)
    images = dec.decode([nic.CodeStream(p) for p in paths], params=params)
    return [np.asarray(img.cpu()) for img in images]


def torchvision_full(paths):
    import torch
    import torchvision.io as tio

    data = [tio.read_file(p) for p in paths]
    out = tio.decode_jpeg(data, device="cuda", mode=tio.ImageReadMode.RGB)
    torch.cuda.synchronize()
    return [img.permute(1, 2, 0).cpu().numpy() for img in out]


def dali_full(paths, fancy: bool, hw_load: float, device: str = "mixed"):
    from nvidia.dali import fn, pipeline_def, types

    gpu = dict(hw_decoder_load=hw_load, jpeg_fancy_upsampling=fancy) if device == "mixed" else {}

    @pipeline_def(batch_size=len(paths), num_threads=4, device_id=0 if device == "mixed" else None)
    def images():
        names = fn.external_source(name="paths", dtype=types.UINT8, ndim=1)
        return fn.decoders.image(fn.io.file.read(names), device=device, output_type=types.RGB,
                                 adjust_orientation=False, **gpu)

    pipe = images()
    pipe.build()
    pipe.feed_input("paths", [np.frombuffer(p.encode(), np.uint8) for p in paths])
    (out,) = pipe.run()
    out = out.as_cpu() if device == "mixed" else out
    return [np.asarray(out.at(k)) for k in range(len(paths))]


def pipeline_224(paths, library: str, dali: dict | None = None):
    """The decoder class `batch` uses, 224x224 imagenet geometry, host uint8."""
    import onnxaccel.prepost.dali as dl
    import onnxaccel.prepost.decode as d
    from onnxaccel.inputs_files import ImagePreprocess

    d.NvjpegDecoder.LIBRARY = library
    for key, value in (dali or {}).items():
        setattr(dl.DaliDecoder, key, value)
    dec = d.gpu_decoder(224, 224, ImagePreprocess(preset="imagenet"))
    out, bad = dec.decode(paths)
    assert not bad, bad
    return list(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jpegs", default="/tmp/oa-batch/jpegs")
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    from onnxaccel.inputs_files import ImagePreprocess
    from onnxaccel.prepost.decode import decode_pixels

    if not any(Path(a.jpegs).glob("*.jpg")):
        import sys

        sys.path.insert(0, str(Path(__file__).parent))
        from batch_vs_bench import make_jpegs

        make_jpegs(Path(a.jpegs), max(a.count, 1000))
    paths = sorted(str(x) for x in Path(a.jpegs).glob("*.jpg"))[: a.count]
    report: dict = {"images": len(paths), "full": {}, "imagenet_224": {}}
    ref_full = pillow_full(paths)
    pre = ImagePreprocess(preset="imagenet")
    ref_224 = [decode_pixels(x, 224, 224, pre, reduced=False) for x in paths]
    report["imagenet_224"]["cpu_reduced (the CPU path's draft)"] = stats(
        [decode_pixels(x, 224, 224, pre) for x in paths], ref_224)
    full = {"dali_cpu (libjpeg-turbo)": lambda ps: dali_full(ps, False, 0, "cpu"), "nvimgcodec": nvimgcodec_full, "torchvision": torchvision_full,
            "dali": lambda ps: dali_full(ps, False, 0.9), "dali_fancy": lambda ps: dali_full(ps, True, 0.9),
            "dali_cuda_fancy": lambda ps: dali_full(ps, True, 0.0), "dali_cuda": lambda ps: dali_full(ps, False, 0.0)}
    for name, fn in full.items():
        began = time.perf_counter()
        try:
            report["full"][name] = stats(fn(paths), ref_full)
        except Exception as exc:  # a library missing or failing here is reported, the others still run
            report["full"][name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        report["full"][name]["seconds"] = round(time.perf_counter() - began, 2)
        print("full", name, report["full"][name], flush=True)
    ours = {"nvimgcodec": ("nvimgcodec", None), "torchvision": ("torchvision", None),
            "dali": ("dali", {"FANCY_UPSAMPLING": False}), "dali_fancy": ("dali", {"FANCY_UPSAMPLING": True})}
    for name, (library, dali) in ours.items():
        try:
            report["imagenet_224"][name] = stats(pipeline_224(paths, library, dali), ref_224)
        except Exception as exc:
            report["imagenet_224"][name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        print("224", name, report["imagenet_224"][name], flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
