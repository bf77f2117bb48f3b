"""How close does `batch` come to the model alone? One run: bench's tuned model-only throughput at each batch, then
`batch` from uint8 .npy shards and from a folder of real-photo JPEGs (embedded preprocessing, pipelined, stage
breakdown), and image decode rates (CPU process pool vs the GPU decoder alone). Driven by benchmarks/batch_gpu.sh.

    python3 benchmarks/batch_vs_bench.py --model zoo:resnet50 \
        --target 'cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1&enable_cuda_graph=1' \
        --batches 64,256 --jpegs 10000 --npy-rows 20480 --check 200 --work /tmp/oa-batch --out results.json
    python3 benchmarks/batch_vs_bench.py --tiny   # CPU: squeezenet, 200 JPEGs, proves the script end to end

The JPEGs are scikit-image's sample photographs (skimage/data) re-encoded at ImageNet-like sizes (longer side
400-500 px) and qualities (75-90); the goals (docs/BENCHMARKS.md, "Batch"): .npy >= 85% and JPEG >= 60% of bench
at the same batch. --variants names A/B switches of the pipeline's settings (VARIANTS; the history of the runs that
used them: docs/benchmarks-history/issue-22.md); "new" is the code as it is. The switches patch the settings where
they live now (the plan, scale/decode_sources.py, prepost/nvjpeg.py, prepost/dali.py). "serialplan" and
"serialplan_b" are gone: they turned off choosing the decoder in a thread beside the sessions' compile
(scale/pipeline.py PLAN_IN_THREAD), and that switch no longer exists (the decoder is always chosen beside them).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PHOTOS = ("astronaut.png", "coffee.png", "chelsea.png", "motorcycle_left.png", "motorcycle_right.png", "rocket.jpg",
          "immunohistochemistry.png", "hubble_deep_field.jpg", "logo.png", "color.png")
OA = [sys.executable, "-m", "onnxaccel.cli.main"]


def photos() -> list:
    from PIL import Image

    spec = importlib.util.find_spec("skimage")
    if spec is None or spec.origin is None:
        raise SystemExit("scikit-image is needed for its sample photographs (pip install scikit-image)")
    data = Path(spec.origin).parent / "data"
    return [Image.open(data / n).convert("RGB") for n in PHOTOS if (data / n).is_file()]


def make_jpegs(folder: Path, count: int) -> Path:

    if folder.is_dir() and len(list(folder.glob("*.jpg"))) == count:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    from concurrent.futures import ProcessPoolExecutor

    workers = max(1, min(16, os.cpu_count() or 1))
    with ProcessPoolExecutor(workers) as pool:  # ~3 ms an image: 10,000 take 2-3 s on 16 cores
        list(pool.map(_encode_range, [(str(folder), i, count, workers) for i in range(workers)]))
    return folder


def _encode_range(job: tuple) -> None:
    from PIL import Image

    folder, first, count, step = job
    sources = photos()
    for i in range(first, count, step):
        img = sources[i % len(sources)]
        side = 500 - 25 * ((i // len(sources)) % 5)
        scale = side / max(img.size)
        img = img.resize((round(img.width * scale), round(img.height * scale)), Image.BILINEAR)
        buffer = io.BytesIO()
        img.save(buffer, "JPEG", quality=75 + 5 * (i % 4))
        (Path(folder) / f"img-{i:06d}.jpg").write_bytes(buffer.getvalue())


def check_outputs(a, work: Path, jpegs: Path, rows: int, batch: int) -> dict:
    """The GPU's padded, graph-replayed batches answer like the CPU: ``rows`` JPEGs (not a multiple of
    ``batch``, so the last batch is padded) run on --target with the CPU decode pool and with the automatic
    decoder, and on cpu; top-1 agreement and the largest logit difference against the CPU run."""
    from onnxaccel.scale.writer import load_results

    sub = work / f"check-{rows}"
    if not sub.is_dir():
        sub.mkdir(parents=True)
        for f in sorted(jpegs.glob("*.jpg"))[:rows]:
            (sub / f.name).symlink_to(f)
    runs = {"cpu": ("cpu", "cpu-pool"), "target_cpu_pool": (a.target, "cpu-pool"), "target_auto": (a.target, "auto")}
    outs, report = {}, {"rows": rows, "batch": batch}
    for name, (target, decoder) in runs.items():
        out = work / f"check-out-{name}"
        subprocess.run(["rm", "-rf", str(out)])
        rep = run_json(["batch", a.model, "--input", str(sub), "--output", str(out), "--target", target,
                        "--batch", str(batch), "--embed-preprocess", "imagenet", "--decoder", decoder, "--json"],
                       a.timeout)
        if "error" in rep:
            report[name] = {"error": rep["error"]}
            continue
        res = load_results(out)
        outs[name] = (res.row_ids, next(iter(res.outputs.values())).astype(np.float32))
        report[name] = {"rows": len(res.row_ids), "decoder": (rep.get("stages") or {}).get("decoder"),
                        "target": rep.get("target")}
    if "cpu" in outs:
        ids, ref = outs["cpu"]
        for name in ("target_cpu_pool", "target_auto"):
            if name in outs:
                other_ids, got = outs[name]
                same = other_ids == ids
                report[name].update({
                    "same_row_ids": same,
                    "top1_agreement": float(np.mean(got.argmax(-1) == ref.argmax(-1))) if same else None,
                    "max_abs_diff": float(np.abs(got - ref).max()) if same else None,
                    "ref_abs_max": float(np.abs(ref).max())})
    return report


def make_npy(folder: Path, rows: int, per_shard: int, size: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i, start in enumerate(range(0, rows, per_shard)):
        n = min(per_shard, rows - start)
        np.save(folder / f"part-{i:04d}.npy", rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8))
    return folder


#: A/B variants of the pipeline's settings (--variants): Python run in the `batch` process before the CLI, each
#: assignment to a setting where it lives now (the plan's decisions in onnxaccel.plan, read when the job plans;
#: the decode sources in onnxaccel.scale.decode_sources; the decoders' class settings in onnxaccel.prepost.nvjpeg
#: and onnxaccel.prepost.dali). "new" is the code as it is; "old" undoes the page-locked slots with direct copies,
#: the blocking GPU wait, the 0.5 ms GIL switch and the one CPU thread per GPU session. :func:`variant_problems`
#: checks that every module and setting a variant names still exists (``--check-variants``; each run checks its own).
_PLAN = "import onnxaccel.plan as plan; "
_SOURCES = "import onnxaccel.scale.decode_sources as ds; "
_NVJPEG = "from onnxaccel.prepost.nvjpeg import NvjpegDecoder as nv; "
_DALI = "from onnxaccel.prepost.dali import DaliDecoder as dl; "
_NO_DIRECT = ("import onnxaccel.scale.host_sources as hs, onnxaccel.scale.decode_sources as ds; "
              "hs._direct_copies = ds._direct_copies = lambda w, every=False: 'off (A/B)'; ")
_TRACE = "import sys; sys.path.insert(0, 'benchmarks/history'); import i22_trace; "
VARIANTS = {
    "new": "",
    "old": _NO_DIRECT + _PLAN + ("plan.GIL_SWITCH_MS = 5.0; plan.GPU_WAIT = 'auto'; "
                                 "plan.gpu_session_threads = lambda t: {}"),
    "noslots": _NO_DIRECT,
    "nvproc": _SOURCES + "ds.NVJPEG_IN_PROCESS = False",
    "inproc": _SOURCES + "ds.NVJPEG_IN_PROCESS = True",
    "inproc1": _SOURCES + "ds.NVJPEG_IN_PROCESS = True; ds.GPU_DECODE_THREADS = 1",
    "inproc4": _SOURCES + "ds.NVJPEG_IN_PROCESS = True; ds.GPU_DECODE_THREADS = 4",
    "inprio": _SOURCES + _NVJPEG + "ds.NVJPEG_IN_PROCESS = True; nv.STREAM_PRIORITY = -1",
    "inprio1": _SOURCES + _NVJPEG + "ds.NVJPEG_IN_PROCESS = True; nv.STREAM_PRIORITY = -1; ds.GPU_DECODE_THREADS = 1",
    "tvision": _NVJPEG + "nv.LIBRARY = 'torchvision'",
    "spin": _PLAN + "plan.GPU_WAIT = 'auto'",
    "nic_hw": _NVJPEG + "nv.BACKENDS = ('hw',)",
    "nic_hw_t2": _NVJPEG + "nv.BACKENDS = ('hw',); nv.CPU_THREADS = 2",
    "nic_hw_t2_prio": _NVJPEG + "nv.BACKENDS = ('hw',); nv.CPU_THREADS = 2; nv.STREAM_PRIORITY = -1",
    "groups": _NVJPEG + "nv.GEOMETRY = 'groups'",
    "tv_groups": _NVJPEG + "nv.GEOMETRY = 'groups'; nv.LIBRARY = 'torchvision'",
    "dali": _NVJPEG + "nv.LIBRARY = 'dali'",
    "dali_t1": _NVJPEG + _SOURCES + "nv.LIBRARY = 'dali'; ds.GPU_DECODE_THREADS = 1",
    "dali_t3": _NVJPEG + _SOURCES + "nv.LIBRARY = 'dali'; ds.GPU_DECODE_THREADS = 3",
    "dali_t4": _NVJPEG + _SOURCES + "nv.LIBRARY = 'dali'; ds.GPU_DECODE_THREADS = 4",
    "dali_cpu8": _NVJPEG + _DALI + "nv.LIBRARY = 'dali'; dl.CPU_THREADS = 8",
    "dali_t3_cpu6": _NVJPEG + _DALI + _SOURCES + "nv.LIBRARY = 'dali'; dl.CPU_THREADS = 6; ds.GPU_DECODE_THREADS = 3",
    "tv_t3": _NVJPEG + _SOURCES + "nv.LIBRARY = 'torchvision'; ds.GPU_DECODE_THREADS = 3",
    "nic": _NVJPEG + "nv.LIBRARY = 'nvimgcodec'",
    "dali_smallwarm": _NVJPEG + _DALI + "nv.LIBRARY = 'dali'; dl.WARM_SIZES = nv.WARM_SIZES",
    "dali_fancy": _NVJPEG + _DALI + "nv.LIBRARY = 'dali'; dl.FANCY_UPSAMPLING = True",
    "dali_nofancy": _NVJPEG + _DALI + "nv.LIBRARY = 'dali'; dl.FANCY_UPSAMPLING = False",
    "dali_hw09": _NVJPEG + _DALI + "nv.LIBRARY = 'dali'; dl.HW_DECODER_LOAD = 0.9",
    "dali_hw10": _NVJPEG + _DALI + "nv.LIBRARY = 'dali'; dl.HW_DECODER_LOAD = 1.0",
    "nowarm": _NVJPEG + "nv.WARM_UP = 0",
    "tv_nowarm": _NVJPEG + "nv.WARM_UP = 0; nv.LIBRARY = 'torchvision'",
    "nic_gpu": _NVJPEG + "nv.BACKENDS = ('gpu',)",
    "nic_t2": _NVJPEG + "nv.CPU_THREADS = 2",
    "nic_t4": _SOURCES + "ds.GPU_DECODE_THREADS = 4",
    "nic_t1": _SOURCES + "ds.GPU_DECODE_THREADS = 1",
    "trace": _TRACE + "i22_trace.start('nic')",
    "trace_tv": _TRACE + _NVJPEG + "nv.LIBRARY = 'torchvision'; i22_trace.start('tv')",
    "trace_dali3": (_TRACE + _NVJPEG + _SOURCES + "nv.LIBRARY = 'dali'; ds.GPU_DECODE_THREADS = 3; "
                    "i22_trace.start('dali3')"),
    "trace_tv3": (_TRACE + _NVJPEG + _SOURCES + "nv.LIBRARY = 'torchvision'; ds.GPU_DECODE_THREADS = 3; "
                  "i22_trace.start('tv3')"),
    "i1": _PLAN + "plan.BATCH_GPU_INSTANCES = 1",
    "i3": _PLAN + "plan.BATCH_GPU_INSTANCES = 3",
}


def variant_problems(code: str) -> list[str]:
    """What a variant names that no longer exists: it runs the variant's imports (and ``sys.path`` changes), checks
    that every attribute it assigns is already there and that every function it calls resolves, and assigns or
    calls nothing. An assignment to a setting that was renamed or moved would otherwise pass silently."""
    import ast

    problems, names = [], {}
    for node in ast.parse(code).body:
        try:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                exec(compile(ast.Module([node], []), "<variant>", "exec"), names)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute):
                        owner = eval(compile(ast.Expression(target.value), "<variant>", "eval"), names)
                        if not hasattr(owner, target.attr):
                            problems.append(f"{ast.unparse(target)}: {ast.unparse(target.value)} has no "
                                            f"{target.attr}")
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                if ast.unparse(node.value.func) == "sys.path.insert":
                    exec(compile(ast.Module([node], []), "<variant>", "exec"), names)
                else:
                    eval(compile(ast.Expression(node.value.func), "<variant>", "eval"), names)
        except (ImportError, AttributeError, NameError) as exc:
            problems.append(f"{ast.unparse(node)}: {type(exc).__name__}: {exc}")
    return problems


LAUNCH = "import os, runpy; exec(os.environ.get('I22_PATCH', '')); runpy.run_module('onnxaccel.cli.main', run_name='__main__')"


def run_json(args: list[str], timeout: int, variant: str = "new") -> dict:
    start = time.perf_counter()
    env = {**os.environ, "I22_PATCH": VARIANTS[variant]}
    proc = subprocess.run([sys.executable, "-c", LAUNCH, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 3):
        return {"error": proc.stderr[-2000:], "rc": proc.returncode, "cmd": " ".join(args)}
    out = json.loads(proc.stdout)
    out["_wall_s"], out["_cmd"] = wall, " ".join(args)
    return out


def best_throughput(report) -> float | None:
    """The largest throughput_items_per_s anywhere in a bench --json report."""
    found = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "throughput_items_per_s" and isinstance(v, (int, float)):
                    found.append(float(v))
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(report)
    return max(found) if found else None


def decode_rates(folder: Path, count: int, batch: int) -> dict:
    from onnxaccel.inputs_files import ImagePreprocess
    from onnxaccel.prepost.cpu_decode import decode_pixels
    from onnxaccel.prepost.decode import gpu_decoder, nvjpeg_missing
    from onnxaccel.prepost.decode_pool import DecodePool, pool_size

    files = sorted(str(p) for p in folder.glob("*.jpg"))[:count]
    pre = ImagePreprocess(preset="imagenet")
    out = {}
    start = time.perf_counter()
    for path in files[: min(len(files), 200)]:
        decode_pixels(path, 224, 224, pre)
    out["cpu_one_core_img_s"] = min(len(files), 200) / (time.perf_counter() - start)
    pool = DecodePool(2, batch, 224, 224, pre, workers=pool_size())
    try:
        for f in pool.submit(0, files[:batch]):
            f.result()  # workers started
        start = time.perf_counter()
        pending = []
        for i, s in enumerate(range(0, len(files), batch)):
            pending.append(pool.submit(i % 2, files[s:s + batch]))
            if len(pending) == 2:
                for f in pending.pop(0):
                    f.result()
        for fs in pending:
            for f in fs:
                f.result()
        out["cpu_pool_img_s"] = len(files) / (time.perf_counter() - start)
        out["cpu_pool_workers"] = pool.workers
    finally:
        pool.close()
    missing = nvjpeg_missing()
    if missing:
        out["nvjpeg"] = f"not measured: {missing}"
    else:
        dec = gpu_decoder(224, 224, pre)
        dec.decode(files[:batch])
        dec.phases = dict.fromkeys(dec.phases, 0)
        start = time.perf_counter()
        for s in range(0, len(files), batch):
            dec.decode_device(files[s:s + batch])  # on the device, as the job takes them
        out["nvjpeg_img_s"] = len(files) / (time.perf_counter() - start)
        out["nvjpeg_phases"] = dec.phases  # the same phases the pipeline's GPU process reports
        out["nvjpeg_library"] = dec.library
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="zoo:resnet50")
    p.add_argument("--target", default="cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1&enable_cuda_graph=1")
    p.add_argument("--batches", default="64,256")
    p.add_argument("--jpegs", type=int, default=10000)
    p.add_argument("--npy-rows", type=int, default=20480)
    p.add_argument("--work", default="/tmp/oa-batch")
    p.add_argument("--out", default=None)
    p.add_argument("--bench-args", default="--iobinding on --graph on", help="extra bench flags")
    p.add_argument("--timeout", type=int, default=240)
    p.add_argument("--jpeg-decoders", default="auto", help="comma-separated --decoder values, one JPEG run each")
    p.add_argument("--variants", default="new", help=f"comma-separated A/B variants of every batch run: {list(VARIANTS)}")
    p.add_argument("--npy-variants", default=None, help="variants of the .npy runs (default: --variants)")
    p.add_argument("--quick", action="store_true", help="no bench, no isolated decode rates (a short lease)")
    p.add_argument("--check", type=int, default=0, help="first compare --target with cpu on this many JPEGs")
    p.add_argument("--tiny", action="store_true", help="CPU proof: squeezenet, 200 JPEGs, 256 .npy rows, batch 8")
    p.add_argument("--check-variants", action="store_true",
                   help="check that every variant's modules and settings exist, then exit")
    a = p.parse_args()
    if a.check_variants:
        problems = {v: variant_problems(VARIANTS[v]) for v in VARIANTS}
        for v, found in problems.items():
            print(f"{v}: {'; '.join(found) if found else 'ok'}")
        raise SystemExit(1 if any(problems.values()) else 0)
    asked = {*a.variants.split(","), *(a.npy_variants or "").split(",")} - {"", "none"}
    unknown = sorted(asked - set(VARIANTS))
    stale = {v: variant_problems(VARIANTS[v]) for v in sorted(asked & set(VARIANTS))}
    wrong = [f"unknown variant {v} (known: {', '.join(VARIANTS)})" for v in unknown]
    wrong += [f"variant {v}: {'; '.join(found)}" for v, found in stale.items() if found]
    if wrong:
        raise SystemExit("\n".join(wrong))
    if a.tiny:
        a.model, a.target, a.batches, a.jpegs, a.npy_rows, a.bench_args = "zoo:squeezenet", "cpu", "8", 200, 256, ""
        a.check = a.check or 21
    work = Path(a.work)
    batches = [int(b) for b in a.batches.split(",")]
    results: dict = {"model": a.model, "target": a.target, "cores": os.cpu_count(), "runs": []}
    jpegs = make_jpegs(work / "jpegs", a.jpegs)
    npy = make_npy(work / "npy", a.npy_rows, per_shard=max(batches) * 8, size=224) if a.npy_rows else None
    if a.check:
        results["check"] = check_outputs(a, work, jpegs, a.check, min(batches))
        print("check:", json.dumps(results["check"]), flush=True)
        save(a, results)
    if not a.quick:
        try:
            results["decode"] = decode_rates(jpegs, min(a.jpegs, 2048), max(batches))
        except Exception as exc:  # a decoder that fails here must not cost the batch runs below
            results["decode"] = {"error": f"{type(exc).__name__}: {exc}"}
        print("decode:", json.dumps(results["decode"]), flush=True)
        save(a, results)
    for b in batches:
        bench = {} if a.quick else run_json(["bench", a.model, "-t", a.target, "-b", str(b), *a.bench_args.split(),
                                             "--json"], a.timeout)
        model_only = best_throughput(bench)
        row = {"batch": b, "bench_img_s": model_only, "bench_error": bench.get("error")}
        variants = a.variants.split(",")
        references: dict = {}
        tag = (lambda v: "" if v == "new" and len(variants) == 1 else f"@{v}")
        runs = [(f"npy_u8{tag(v)}", npy, "auto", v) for v in (a.npy_variants or a.variants).split(",")
                if npy is not None and v != "none"]
        runs += [(f"jpeg_{d}{tag(v)}" if d != "auto" else f"jpeg{tag(v)}", jpegs, d, v)
                 for d in (a.jpeg_decoders.split(",") if a.jpeg_decoders else []) for v in variants]
        for name, folder, decoder, variant in runs:
            out = work / f"out-{name}-{b}"
            rep = run_json(["batch", a.model, "--input", str(folder), "--output", str(out), "--target", a.target,
                            "--batch", str(b), "--embed-preprocess", "imagenet", "--overwrite", "--decoder", decoder,
                            "--images-per-shard", str(b * 16), "--json"], a.timeout, variant)
            if "error" in rep:
                row[name] = {"error": rep["error"]}
                continue
            same = _same_as_first(references, name.split("@")[0], out)
            subprocess.run(["rm", "-rf", str(out)])  # rerun from scratch next time (no resume skip)
            rate = rep["rows_per_s"]
            row[name] = {"rows_per_s": rate, "rows_per_s_wall": rep["rows_per_s_wall"], "stages": rep["stages"],
                         "startup_s": rep.get("startup_s"), "wall_s": rep.get("wall_s"), "cli_wall_s": rep["_wall_s"],
                         "pct_of_bench": 100 * rate / model_only if model_only else None, "vs_first_variant": same}
        goals = {name: 85 if name.startswith("npy_u8") else 60 for name, _, _, _ in runs}
        for name, goal in goals.items():
            r = row.get(name, {})
            pct = r.get("pct_of_bench")
            st = r.get("stages") or {}
            print(f"batch {b}: {name}: {r.get('rows_per_s', 0):,.0f} rows/s = "
                  f"{pct if pct is not None else float('nan'):.0f}% of bench {model_only or 0:,.0f} (goal {goal}%); "
                  f"bottleneck {st.get('bottleneck')}, decoder {st.get('decoder')}; "
                  + ", ".join(f"{k} {v['pct_of_wall']:.0f}%" for k, v in (st.get("stages") or {}).items())
                  + f"; copies: {st.get('host_copies')}; vs first variant {r.get('vs_first_variant')}" + "".join(f"; {n}" for n in st.get("notes") or []) + (f"; error {r['error'][-300:]}" if "error" in r
                                                                       else ""),
                  flush=True)
        results["runs"].append(row)
        save(a, results)
    print(json.dumps(results, indent=2))


def _same_as_first(references: dict, key: str, out: Path) -> dict | None:
    """The outputs of a run against the first variant's run of the same input (the A/B changes how rows reach the
    device, never what is computed): rows in the same order, top-1 agreement, largest difference."""
    from onnxaccel.scale.writer import load_results

    res = load_results(out)
    ids, values = res.row_ids, next(iter(res.outputs.values())).astype(np.float32)
    if key not in references:
        references[key] = (ids, values)
        return None
    ref_ids, ref = references[key]
    if ids != ref_ids:
        return {"same_row_ids": False}
    return {"same_row_ids": True, "top1_agreement": float(np.mean(values.argmax(-1) == ref.argmax(-1))),
            "max_abs_diff": float(np.abs(values - ref).max())}


def save(a, results: dict) -> None:
    """Write what is measured so far (a run cut short by the device's limit keeps it)."""
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
