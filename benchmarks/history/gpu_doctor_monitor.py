"""Doctor, monitor and the NVML sampler on a real NVIDIA GPU: the figures for docs/BENCHMARKS.md (issue 3).

Run on the H200 machine from the repository root:

    python -m venv /tmp/venv && . /tmp/venv/bin/activate
    pip install -e '.[cuda]' 'onnxruntime-gpu[cuda,cudnn]==1.31.1' nvidia-ml-py
    python benchmarks/history/gpu_doctor_monitor.py --duration 10 > gpu_doctor_monitor.json

It prints one JSON document to stdout (progress goes to stderr):

* ``doctor``: ``onnxaccel doctor --target cuda --json`` (exit status and report; the cuda verdict must be ready);
* ``monitor_cli``: ``onnxaccel monitor --json --count 5 --interval 0.2`` (must read the GPU through NVML);
* ``idle``: the sampler on the idle GPU for 2 s;
* ``run``: zoo:resnet50 on --target cuda for ``--duration`` s while the sampler reads NVML every
  ``--interval`` s: per-GPU mean/peak utilization, memory, power, temperature, clocks;
* ``overhead``: the sampler's own cost: CPU ms of its thread per sample, the share of a core at the chosen
  interval and at 10 ms, and the change of the model's p50 latency with vs without sampling.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback

SCHEMA = "onnxaccel.benchmark.gpu_doctor_monitor/1"


def log(message: str) -> None:
    print(f"[gpu_doctor_monitor] {message}", file=sys.stderr, flush=True)


def cli(*args: str, timeout: float = 300) -> dict:
    done = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)
    out: dict = {"argv": ["onnxaccel", *args], "exit_status": done.returncode, "stderr_tail": done.stderr[-2000:]}
    try:
        out["json"] = json.loads(done.stdout)
    except json.JSONDecodeError:
        lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
        try:
            out["json_lines"] = [json.loads(ln) for ln in lines]
        except json.JSONDecodeError:
            out["stdout_tail"] = done.stdout[-4000:]
    return out


def step(result: dict, name: str, function) -> None:
    log(f"{name} ...")
    start = time.perf_counter()
    try:
        result[name] = function()
    except Exception as exc:  # noqa: BLE001 - record and go on: the lead needs every part that works
        result[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    log(f"{name} done in {time.perf_counter() - start:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of inference while sampling")
    parser.add_argument("--interval", type=float, default=0.1, help="sampler interval in seconds")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--target", default="cuda")
    args = parser.parse_args()

    from onnxaccel.bench.timing import measure
    from onnxaccel.pipeline import prepare
    from onnxaccel.system.telemetry import GpuSampler
    from onnxaccel.target import parse_target

    result: dict = {"schema": SCHEMA, "args": vars(args)}
    step(result, "doctor", lambda: cli("doctor", "--target", args.target, "--json"))
    step(result, "monitor_cli", lambda: cli("monitor", "--json", "--count", "5", "--interval", "0.2"))

    def idle() -> dict:
        sampler = GpuSampler(interval=args.interval).start()
        time.sleep(2.0)
        return sampler.stop().to_dict()

    step(result, "idle", idle)

    prepared: dict = {}

    def build() -> dict:
        p = prepare("zoo:resnet50", parse_target(args.target), batch=args.batch)
        prepared["p"] = p
        return {"providers": p.runner.providers, "compile_seconds": p.runner.compile_seconds,
                "placement": p.runner.placement.summary(), "warnings": p.warnings}

    step(result, "session", build)
    if "p" not in prepared:
        print(json.dumps(result, indent=2, default=str))
        return 1
    p = prepared["p"]

    def run_plain() -> dict:
        timing = measure(p.runner, p.feeds, batch=args.batch, warmup=20, runs=None, duration=args.duration)
        return timing.to_dict()

    def run_sampled() -> dict:
        sampler = GpuSampler(interval=args.interval).start()
        timing = measure(p.runner, p.feeds, batch=args.batch, warmup=20, runs=None, duration=args.duration)
        summary = sampler.stop()
        return {"timing": timing.to_dict(), "telemetry": summary.to_dict()}

    step(result, "run_without_sampler", run_plain)
    step(result, "run", run_sampled)

    def stress() -> dict:
        sampler = GpuSampler(interval=0.01).start()
        time.sleep(2.0)
        return sampler.stop().overhead.to_dict()

    step(result, "sampler_at_10ms", stress)

    def overhead() -> dict:
        plain = result["run_without_sampler"]["latency"]["p50_ms"]
        sampled = result["run"]["timing"]["latency"]["p50_ms"]
        return {"p50_ms_without_sampler": plain, "p50_ms_with_sampler": sampled,
                "p50_change_pct": (sampled - plain) / plain * 100.0,
                "sampler": result["run"]["telemetry"]["overhead"], "sampler_at_10ms": result.get("sampler_at_10ms")}

    step(result, "overhead", overhead)
    verdict = (result["doctor"].get("json") or {}).get("targets", [{}])[0]
    result["checks"] = {
        "doctor_target_ready": bool(verdict.get("ready")) and result["doctor"].get("exit_status") == 0,
        "monitor_read_nvml": any(line.get("gpus") for line in result["monitor_cli"].get("json_lines", [])),
        "sampler_saw_gpu": bool(result["run"].get("telemetry", {}).get("gpus")) if isinstance(result.get("run"), dict) else False,
    }
    print(json.dumps(result, indent=2, default=str))
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
