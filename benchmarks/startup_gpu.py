"""How long until the first result, and until a server is ready? Each figure is a fresh process, on one machine,
side by side with a plain ONNX Runtime script on the same model and options (issue 36's table):

  plain      python: import onnxruntime, a session on the cached FP16 model, the first b=BATCH run with IO binding
  run        `onnxaccel run MODEL -t TARGET -b BATCH --iobinding --json`: whole process, and its start-up stages
  bench      `onnxaccel bench ... --runs 20 --json`: time to its first measured result
  serve      `onnxaccel serve MODEL --target cuda:0 --precision fp16 --max-batch 64 --json` (default layout) until
             the ready event, and until GET /v2/health/ready answers 200; its start-up stages
  kill       SIGKILL of the model process (onnxaccel-model) under load: seconds until a request succeeds again,
             the status codes seen meanwhile, and whether /v2/health/live stayed 200
  batch      `onnxaccel batch` over NPY_ROWS uint8 .npy rows: time to the first rows computed, rows/s all-in
             and steady

"cold" runs get an empty ONNXACCEL_CACHE_DIR (the built zoo model linked in); "warm" runs the cache the cold run
left. Usage on the GPU machine, from the repository root (after `source benchmarks/gpu_setup.sh`):

    python3 benchmarks/startup_gpu.py --out /tmp/startup [--parts plain,run,bench,serve,kill,batch] [--src SRC]

Writes startup.json (every figure and report) and prints the table. CPU check (no figure to keep):
    python3 benchmarks/startup_gpu.py --cpu-test --out /tmp/startup-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

PLAIN = r"""
import sys, time, json
t0 = time.perf_counter()
import numpy as np, onnxruntime as ort
t1 = time.perf_counter()
path, provider, batch, options = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
providers = [(provider, options), "CPUExecutionProvider"] if provider != "CPUExecutionProvider" else [provider]
session = ort.InferenceSession(path, providers=providers)
t2 = time.perf_counter()
inp = session.get_inputs()[0]
shape = [batch] + [d if isinstance(d, int) else 1 for d in inp.shape[1:]]
x = np.zeros(shape, np.uint8 if "uint8" in inp.type else np.float32)
binding = session.io_binding()
device = "cuda" if provider == "CUDAExecutionProvider" else "cpu"
binding.bind_ortvalue_input(inp.name, ort.OrtValue.ortvalue_from_numpy(x, device, 0))
for out in session.get_outputs():
    binding.bind_output(out.name, device)
session.run_with_iobinding(binding)
binding.copy_outputs_to_cpu()
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "session_s": t2 - t1, "first_run_s": t3 - t2}))
"""


def sh(cmd, env, timeout=900) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``cmd``: (wall seconds, the finished process); raises on a non-zero exit."""
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stderr[-3000:]}"
                           f"\n{done.stdout[-3000:]}")
    return wall, done


def stages(started: dict | None) -> dict:
    return {r["stage"]: round(r["seconds"], 3) for r in (started or {}).get("stages", ())}


class Bench:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.results: dict = {"args": vars(args), "figures": {}}
        self.zoo = self.out / "zoo-cache"
        # python -m onnxaccel (trees before it had __main__.py: their CLI module)
        main = "onnxaccel" if not args.src or (Path(args.src) / "onnxaccel" / "__main__.py").exists() else \
            "onnxaccel.cli.main"
        self.oa = [sys.executable, "-m", main]

    def env(self, cache: Path) -> dict:
        env = {**os.environ, "ONNXACCEL_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
        if self.args.src:
            env["PYTHONPATH"] = self.args.src + os.pathsep + env.get("PYTHONPATH", "")
        return env

    def fresh_cache(self, name: str) -> Path:
        """An empty cache folder, but for the zoo's built models (building one is not a start-up cost)."""
        cache = self.out / name
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
        (cache / "zoo").symlink_to(self.zoo / "zoo")
        return cache

    def figure(self, key: str, value) -> None:
        self.results["figures"][key] = value
        print(f"  {key}: {json.dumps(value) if not isinstance(value, float) else f'{value:.3f}'}", flush=True)

    def setup(self) -> None:
        a = self.args
        self.zoo.mkdir(parents=True, exist_ok=True)
        code = ("from onnxaccel.model import load_model; from onnxaccel.precision.variant import convert_for_target;"
                "from onnxaccel.target import parse_target; import sys;"
                f"v=convert_for_target(load_model({a.model!r}), parse_target({a.target!r}));"
                "print(v.model.path)")
        _, done = sh([sys.executable, "-c", code], self.env(self.zoo))
        self.variant = done.stdout.strip().splitlines()[-1]
        print(f"model variant for the plain script: {self.variant}", flush=True)

    def plain(self) -> None:
        a = self.args
        options = dict(o.split("=", 1) for o in a.plain_options.split("&")) if a.plain_options else {}
        for run in ("first", "second"):
            wall, done = sh([sys.executable, "-c", PLAIN, self.variant, a.provider, str(a.batch), json.dumps(options)],
                            self.env(self.zoo))
            parts = json.loads(done.stdout.strip().splitlines()[-1])
            self.figure(f"plain {run}: whole process s", wall)
            self.figure(f"plain {run}: parts", {k: round(v, 3) for k, v in parts.items()})

    def run(self) -> None:
        a = self.args
        cmd = [*self.oa, "run", a.model, "-t", a.target, "-b", str(a.batch), "--iobinding", "--json"]
        cache = self.fresh_cache("cache-run")
        for run in ("cold", "warm", "warm2"):
            wall, done = sh(cmd, self.env(cache))
            report = json.loads(done.stdout)
            self.figure(f"run {run}: whole process s", wall)
            self.figure(f"run {run}: to first result s", report["startup"]["to_first_result_s"])
            self.figure(f"run {run}: stages", stages(report["startup"]))
        cmd = [*self.oa, "bench", a.model, "-t", a.target, "-b", str(a.batch), "--runs", "20", "--json"]
        wall, done = sh(cmd, self.env(cache))
        report = json.loads(done.stdout)
        self.figure("bench warm: whole process s", wall)
        self.figure("bench warm: to first result s", report["startup"]["to_first_result_s"])
        self.figure("bench warm: stages", stages(report["startup"]))
        self.figure("bench warm: items/s", [c.get("throughput_items_per_s") for c in report["cells"]])

    def serve(self, kill: bool) -> None:
        cache = self.fresh_cache("cache-serve")
        for run in ("cold", "warm"):
            last = run == "warm"
            self.serve_once(run, cache, kill=kill and last)

    def serve_once(self, run: str, cache: Path, *, kill: bool) -> None:
        a = self.args
        port = 18000 + (os.getpid() % 1000)
        cmd = [*self.oa, "serve", a.model, *a.serve_args.split(), "--http-port", str(port), "--no-grpc", "--json"]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=self.env(cache), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        lines: list[tuple[float, str]] = []  # stderr, each line with its arrival (read on: the pipe never fills)
        reader = threading.Thread(target=lambda: lines.extend((time.perf_counter() - start, line) for line in
                                                             iter(proc.stderr.readline, "")), daemon=True)
        reader.start()
        try:
            line = ""
            while not line and proc.poll() is None and time.perf_counter() - start < 600:
                if select.select([proc.stdout], [], [], 0.2)[0]:
                    line = proc.stdout.readline()
            if not line:
                raise RuntimeError("serve never got ready: " + "".join(l for _, l in lines)[-3000:])
            ready_event = time.perf_counter() - start
            if not line.startswith("{\"") and proc.wait(30) is not None:  # an error report (indented JSON)
                raise RuntimeError(f"serve failed: {line}{proc.stdout.read()[-3000:]}")
            event = json.loads(line)
            while _status(f"{url}/v2/health/ready") != 200:
                time.sleep(0.05)
            self.figure(f"serve {run}: to ready event s", ready_event)
            self.figure(f"serve {run}: to /v2/health/ready 200 s", time.perf_counter() - start)
            self.figure(f"serve {run}: to ready (its own startup report) s", (event.get("startup") or {}).get("to_ready_s"))
            self.figure(f"serve {run}: stages", stages(event.get("startup")))
            self.results.setdefault("serve_events", {})[run] = event
            plan = event.get("plan") or {}
            later = len(plan.get("batch_sizes") or ()) - len(plan.get("warm_at_load") or plan.get("batch_sizes") or ())
            joining = (plan.get("instances") or 1) - (plan.get("instances_at_load") or plan.get("instances") or 1)
            if later > 0 or joining > 0:  # warmed after ready (--log-level info says when each is in use)
                def seen(text):
                    return [round(t, 2) for t, l in list(lines) if text in l]

                while time.perf_counter() - start < a.after_ready_s and (
                        len(seen("in use")) < later or len(seen("in service (")) < joining):
                    time.sleep(0.1)
                self.figure(f"serve {run}: instances in service after ready, at s", seen("in service ("))
                self.figure(f"serve {run}: sizes warm after ready, at s", seen("in use"))
            if "steady" in a.parts.split(",") and run == "warm":
                self.steady(url, event)
            if kill:
                self.kill(url, event)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()

    def steady(self, url: str, event: dict) -> None:
        """The served rate once everything is warm: onnxaccel loadtest at concurrency 1, 64 and 256 (binary
        tensors, one row per request), so a faster start shows it did not cost steady-state speed."""
        model = event["models"][0]["name"]
        _, done = sh([*self.oa, "loadtest", url, "-m", model, "-c", "1,64,256", "-d", "6", "--warmup", "2", "--json"],
                     self.env(self.zoo), timeout=120)
        levels = json.loads(done.stdout)["levels"]
        self.figure("serve warm: steady inferences/s at c1,c64,c256",
                    [round(level["inferences_per_s"], 1) for level in levels])
        self.figure("serve warm: p50 ms at c1,c64,c256",
                    [round((level.get("latency") or {}).get("p50_ms", 0), 2) for level in levels])

    def kill(self, url: str, event: dict) -> None:
        """SIGKILL the model process under load; seconds until requests succeed again."""
        model = event["models"][0]["name"]
        body = _infer_body(url, model)
        codes: dict[str, int] = {}
        live: dict[str, int] = {}
        stop = threading.Event()

        def load():
            while not stop.is_set():
                code = _status(f"{url}/v2/models/{model}/infer", body)
                codes[str(code)] = codes.get(str(code), 0) + 1

        threads = [threading.Thread(target=load, daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        # serve/processes.py name_process: the model process is named "onnxaccel-model" (/proc/PID/comm)
        pids = subprocess.run(["pgrep", "-x", "onnxaccel-model"], capture_output=True, text=True).stdout.split()
        if not pids:
            self.figure("kill: model process", "not found (no --shared-models layout?)")
            stop.set()
            return
        codes.clear()
        killed = time.perf_counter()
        os.kill(int(pids[0]), signal.SIGKILL)
        time.sleep(0.2)
        back = None
        while time.perf_counter() - killed < 300:
            code = _status(f"{url}/v2/health/live")
            live[str(code)] = live.get(str(code), 0) + 1
            if _status(f"{url}/v2/models/{model}/infer", body) == 200 and _status(f"{url}/v2/health/ready") == 200:
                back = time.perf_counter() - killed
                break
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(5)
        self.figure("kill: serving again after SIGKILL s", back)
        self.figure("kill: request codes meanwhile", codes)
        self.figure("kill: /v2/health/live codes meanwhile", live)

    def batch(self) -> None:
        a = self.args
        data = self.out / "npy"
        if not data.exists():
            data.mkdir(parents=True)
            import numpy as np

            rng = np.random.default_rng(0)
            shard = 2048
            for i in range(0, a.npy_rows, shard):
                rows = min(shard, a.npy_rows - i)
                np.save(data / f"part-{i // shard:04d}.npy", rng.integers(0, 255, (rows, *a.npy_shape), np.uint8))
        # The plain script at the job's batch size with its target's options (the FP16 model's float input: the
        # job runs the copy with imagenet preprocessing embedded, uint8 input): the reference for its start-up.
        options = dict(o.split("=", 1) for o in a.batch_target.split("?", 1)[1].split("&")) \
            if "?" in a.batch_target else {}
        for run in ("first", "second"):
            wall, done = sh([sys.executable, "-c", PLAIN, self.variant, a.provider, str(a.npy_batch),
                             json.dumps(options)], self.env(self.zoo))
            parts = json.loads(done.stdout.strip().splitlines()[-1])
            self.figure(f"batch plain b{a.npy_batch} {run}: whole process s", wall)
            self.figure(f"batch plain b{a.npy_batch} {run}: parts", {k: round(v, 3) for k, v in parts.items()})
        cache = self.fresh_cache("cache-batch")
        long = self.out / "npy-long"  # the same shards several times over (links): a longer job, no more disk
        if a.long_repeat > 1 and not long.exists():
            long.mkdir()
            for k in range(a.long_repeat):
                for f in sorted(data.glob("part-*.npy")):
                    (long / f"r{k}-{f.name}").symlink_to(f)
        runs = [("cold", data), ("warm", data)] + ([("warm long", long)] if a.long_repeat > 1 else [])
        for run, data in runs:
            out = self.out / f"batch-{run.replace(' ', '-')}"
            cmd = [*self.oa, "batch", a.model, "--input", str(data), "--output", str(out), "-t", a.batch_target,
                   "--batch", str(a.npy_batch), "--embed-preprocess", "imagenet", "--overwrite", "--json"]
            wall, done = sh(cmd, self.env(cache))
            report = json.loads(done.stdout)
            self.figure(f"batch {run}: whole process s", wall)
            self.figure(f"batch {run}: to first rows s", report["startup"]["to_first_result_s"])
            self.figure(f"batch {run}: rows/s all-in, steady", [round(report["rows_per_s_wall"], 1),
                                                                round(report["rows_per_s"], 1)])
            self.figure(f"batch {run}: stages", stages(report["startup"]))
            self.figure(f"batch {run}: rows", (report.get("rows") or {}).get("done"))
            self.figure(f"batch {run}: notes", [n for n in (report.get("stages") or {}).get("notes", [])
                                                if "instance" in n])


def _status(url: str, body: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return -1


def _infer_body(url: str, model: str) -> bytes:
    """One request of one row, zeros, from the model's metadata."""
    with urllib.request.urlopen(f"{url}/v2/models/{model}", timeout=10) as response:
        meta = json.load(response)
    inputs = []
    for spec in meta["inputs"]:
        shape = [1] + [d if d > 0 else 1 for d in spec["shape"][1:]]
        count = 1
        for d in shape:
            count *= d
        inputs.append({"name": spec["name"], "shape": shape, "datatype": spec["datatype"], "data": [0] * count})
    return json.dumps({"inputs": inputs}).encode()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="/tmp/startup")
    p.add_argument("--parts", default="plain,run,serve,kill,batch")
    p.add_argument("--src", default="", help="a src folder to put first on PYTHONPATH (another tree)")
    p.add_argument("--model", default="zoo:resnet50")
    p.add_argument("--target", default="cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1")
    p.add_argument("--provider", default="CUDAExecutionProvider")
    p.add_argument("--plain-options", default="prefer_nhwc=1&fuse_conv_bias=1")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--serve-args", default="--target cuda:0 --precision fp16 --max-batch 64")
    p.add_argument("--batch-target", default="cuda/fp16?prefer_nhwc=1&fuse_conv_bias=1&enable_cuda_graph=1")
    p.add_argument("--npy-rows", type=int, default=20480)
    p.add_argument("--npy-batch", type=int, default=256)
    p.add_argument("--npy-shape", default="224x224x3")
    p.add_argument("--long-repeat", type=int, default=5, help="a warm job over the rows this many times (links)")
    p.add_argument("--after-ready-s", type=float, default=120.0,
                   help="how long after ready to wait for the instances and sizes warmed after ready")
    p.add_argument("--cpu-test", action="store_true", help="the same flow on the CPU with a small model")
    a = p.parse_args()
    if a.cpu_test:
        a.model, a.target, a.provider, a.plain_options, a.batch = "zoo:squeezenet", "cpu", "CPUExecutionProvider", "", 8
        a.serve_args = "--target cpu --max-batch 8 --workers 2 --shared-models"
        a.batch_target, a.npy_rows, a.npy_batch, a.long_repeat = "cpu", 64, 16, 2
    a.npy_shape = tuple(int(d) for d in a.npy_shape.split("x"))
    bench = Bench(a)
    parts = a.parts.split(",")
    began = time.perf_counter()
    bench.setup()
    for part in ("plain", "run", "serve", "batch"):
        if part in parts or (part == "serve" and "kill" in parts):
            print(f"[{time.perf_counter() - began:.0f} s] {part}", flush=True)
            try:
                bench.serve("kill" in parts) if part == "serve" else getattr(bench, part)()
            except Exception as exc:  # noqa: BLE001 - one part failing leaves the others' figures
                bench.figure(f"{part}: FAILED", str(exc)[-2000:])
            # after each part: a call cut short still leaves what was measured
            (bench.out / "startup.json").write_text(json.dumps(bench.results, indent=1, default=str))
    print(f"[{time.perf_counter() - began:.0f} s] wrote {bench.out / 'startup.json'}")


if __name__ == "__main__":
    main()
