"""`tune` against the plain ONNX Runtime session fed numpy arrays, on one NVIDIA H200 (CUDA EP), side by side.

Targets (issue 6, from the hand-tuned anchors in shared/research/h200-anchors-2026-12-02.md):
    zoo:resnet50            batch 1    tuned >= 3.5x   the plain session
    zoo:resnet50            batch 256  tuned >= 1.65x
    zoo:bert-base seq 128   batch 32   tuned >= 1.4x

What runs, in one process:
1. ``bench.tune.tune`` for each case (search bounded by ``--tune-budget`` seconds per case); its own report
   (every candidate) and configuration file go to OUT_DIR.
2. Side by side, every case again, in alternating order over ``--rounds`` rounds: the plain session as most
   guides write it (raw ``onnxruntime.InferenceSession`` + ``session.run(None, numpy_feeds)``, outside
   onnxaccel), the same through onnxaccel (FP32 and FP16 models, numpy in/out), and the tuned configuration.
   Throughput per configuration = median over rounds. The verdict compares the tuned configuration with the
   *fastest* of the plain sessions (so an FP16 model alone does not count as tuning).

Prints JSON and a Markdown table on stdout (progress on stderr); writes OUT_DIR/tune_h200.json and .md,
per-case reports (json, html) and configurations. Exit status 0 when every case met its goal, else 1.
Expected duration on an H200 host: about 5-6 minutes (model builds and FP16 conversions included).

Usage:  python benchmarks/tune_vs_plain.py OUT_DIR [--tune-budget 60] [--rounds 2] [--duration 1.5] [--deadline 420]
        python benchmarks/tune_vs_plain.py OUT_DIR --cpu-dry-run     # the same flow on small models on the CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    batch: int
    shapes: dict
    goal: float


GPU_CASES = (
    Case("resnet50-b1", "zoo:resnet50", 1, {}, 3.5),
    Case("resnet50-b256", "zoo:resnet50", 256, {}, 1.65),
    Case("bert-base-s128-b32", "zoo:bert-base", 32, {"sequence": (128,)}, 1.4),
)
CPU_CASES = (
    Case("squeezenet-b1", "zoo:squeezenet", 1, {}, 1.0),
    Case("bert-tiny-s32-b4", "zoo:bert-tiny", 4, {"sequence": (32,)}, 1.0),
)


#: Plain fp32 sessions as many as the tuned configuration's instances, side by side (reference column).
PARALLEL_PLAIN = "plain fp32, same instances (onnxaccel)"


def raw_plain_throughput(model_path: Path, feeds: dict, batch: int, provider: str, duration: float) -> dict:
    """What most guides do, with no onnxaccel code on the path: a default session, numpy in, numpy out."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=[provider, "CPUExecutionProvider"])
    for _ in range(5):
        session.run(None, feeds)
    samples, start = [], time.perf_counter()
    while time.perf_counter() - start < duration or len(samples) < 5:
        t0 = time.perf_counter()
        session.run(None, feeds)
        samples.append(time.perf_counter() - t0)
    p50 = statistics.median(samples)
    return {"p50_ms": p50 * 1e3, "throughput": batch / p50, "runs": len(samples), "providers": session.get_providers()}


def gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             check=False, capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--tune-budget", type=float, default=60.0, help="seconds of search per case")
    parser.add_argument("--rounds", type=int, default=2, help="side-by-side rounds (alternating order)")
    parser.add_argument("--duration", type=float, default=1.5, help="seconds per side-by-side measurement")
    parser.add_argument("--deadline", type=float, default=420.0,
                        help="seconds: after this, side-by-side rounds beyond the first are skipped")
    parser.add_argument("--cpu-dry-run", action="store_true", help="small models on the CPU, to check the script")
    parser.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    import onnxruntime as ort

    from onnxaccel.bench.cells import SweepCell
    from onnxaccel.bench.config import save_config
    from onnxaccel.bench.host import environment
    from onnxaccel.bench.sweep import Sweep, SweepSettings
    from onnxaccel.bench.tune import TuneSettings, tune
    from onnxaccel.model import load_model
    from onnxaccel.pipeline import prepare
    from onnxaccel.target import parse_target

    device = "cpu" if args.cpu_dry_run else "cuda"
    provider = "CPUExecutionProvider" if args.cpu_dry_run else "CUDAExecutionProvider"
    if provider not in ort.get_available_providers():
        sys.exit(f"{provider} is not in this onnxruntime ({ort.__version__}): install onnxruntime-gpu, or use "
                 "--cpu-dry-run")
    if not args.cpu_dry_run and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    cases = CPU_CASES if args.cpu_dry_run else GPU_CASES
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = tuple(c for c in cases if c.name in wanted)
        if not cases:
            sys.exit(f"no case named {args.cases}; cases: {', '.join(c.name for c in GPU_CASES + CPU_CASES)}")
    duration = 0.3 if args.cpu_dry_run else args.duration

    def log(text: str) -> None:  # progress on stderr; stdout carries only the JSON and the table
        print(f"[{time.perf_counter() - started:6.1f}s] {text}", file=sys.stderr, flush=True)

    summary = {"benchmark": "tune_h200", "environment": environment(), "gpu": gpu_name(), "cases": []}
    log(f"onnxruntime {ort.__version__}, {summary['gpu'] or 'no nvidia-smi'}")

    tuned = {}
    for case in cases:
        model = load_model(case.model)
        log(f"{case.name}: tuning ({model.path})")
        result = tune(model, parse_target(device), TuneSettings(
            batches=(case.batch,), shapes=dict(case.shapes), duration=0.2 if args.cpu_dry_run else 1.0,
            confirm_duration=0.3 if args.cpu_dry_run else 2.0, time_budget_s=args.tune_budget, warmup=10,
            gpu_name=summary["gpu"]),
            report_paths=[args.out / f"{case.name}.tune.json", args.out / f"{case.name}.tune.html"],
            command=f"benchmarks/tune_vs_plain.py ({case.name})")
        save_config(result.config, args.out / f"{case.name}.config.json")
        tuned[case.name] = result
        log(f"{case.name}: {result.summary()[0]} ({result.seconds:.0f} s)")

    # Side by side: all configurations of all cases, alternating order per round.
    plain, plain16 = parse_target(device), parse_target(f"{device}/fp16")
    rows = []
    for case in cases:
        model = load_model(case.model)
        side = Sweep(model, SweepSettings(warmup=10, runs=None, duration=duration, gpu_name=summary["gpu"]),
                     [args.out / f"{case.name}.side.json", args.out / f"{case.name}.side.html"])
        best = tuned[case.name].config
        shapes = tuple(sorted(case.shapes.items()))
        configs = {"plain fp32 (onnxaccel)": SweepCell(str(plain), case.batch, shapes, iobinding=False),
                   "plain fp16 (onnxaccel)": SweepCell(str(plain16), case.batch, shapes, iobinding=False),
                   "tuned": SweepCell(str(best.target), case.batch, shapes, iobinding=best.iobinding,
                                      instances=best.instances)}
        if best.instances > 1:  # the same configuration as one session: what one stream of requests sees
            configs["tuned, 1 instance"] = SweepCell(str(best.target), case.batch, shapes, iobinding=best.iobinding)
            # Not a baseline of the goal (that is one plain session) but shown beside it: plain sessions with
            # the same parallelism, so the table says how much of the gain is parallel streams alone.
            configs[PARALLEL_PLAIN] = SweepCell(str(plain), case.batch, shapes, iobinding=False,
                                                instances=best.instances)
        ref = prepare(model, plain, shapes=dict(case.shapes), batch=case.batch)
        feeds = dict(ref.feeds)
        ref.close()
        through: dict[str, list[float]] = {k: [] for k in ["plain fp32 (raw ORT)", *configs]}
        accuracy = None
        p50: dict[str, list[float]] = {k: [] for k in through}
        for round_index in range(args.rounds):
            if round_index and time.perf_counter() - started > args.deadline:
                summary.setdefault("notes", []).append(f"{case.name}: deadline reached after {round_index} round(s)")
                break
            order = list(configs.items())
            if round_index % 2:
                order.reverse()
            raw = raw_plain_throughput(model.path, feeds, case.batch, provider, duration)
            through["plain fp32 (raw ORT)"].append(raw["throughput"])
            p50["plain fp32 (raw ORT)"].append(raw["p50_ms"])
            for label, cell in order:
                result = side.run([dataclasses.replace(cell, tag=f"round{round_index + 1}")])[0]
                if result.ok:
                    through[label].append(result.throughput)
                    p50[label].append(result.latency.p50)
                    if label == "tuned":
                        accuracy = result.accuracy
                else:
                    log(f"{case.name} {label}: {result.error['message']}")
        med = {k: statistics.median(v) if v else None for k, v in through.items()}
        plains = [v for k, v in med.items() if not k.startswith("tuned") and k != PARALLEL_PLAIN and v]
        fastest_plain = max(plains) if plains else None
        ratio = med["tuned"] / fastest_plain if med["tuned"] and fastest_plain else None
        fp32 = [v for k, v in med.items() if "fp32" in k and k != PARALLEL_PLAIN and v]
        ratio_fp32 = med["tuned"] / max(fp32) if med["tuned"] and fp32 else None
        single = med.get("tuned, 1 instance") if best.instances > 1 else med["tuned"]
        row = {"case": case.name, "model": case.model, "batch": case.batch, "tuned_target": str(best.target),
               "tuned_iobinding": best.iobinding, "tuned_instances": best.instances,
               "speedup_one_instance_vs_fastest_plain": single / fastest_plain if single and fastest_plain else None, "throughput": med, "p50_ms": {k: statistics.median(v) if v else None
                                                                               for k, v in p50.items()},
               "speedup_vs_fastest_plain": ratio, "speedup_vs_plain_fp32": ratio_fp32, "goal": case.goal,
               "tuned_accuracy": {k: (accuracy or {}).get(k) for k in ("reference", "passed", "max_abs")},
               "passed": ratio is not None and ratio >= case.goal and (accuracy or {}).get("passed") is not False,
               "tune_seconds": tuned[case.name].seconds,
               "tune_candidates": len(tuned[case.name].candidates), "tune_notes": tuned[case.name].notes}
        rows.append(row)
        log(f"{case.name}: tuned {ratio or 0:.2f}x the fastest plain session (goal {case.goal}x)")
    summary["cases"] = rows
    summary["seconds"] = time.perf_counter() - started
    summary["passed"] = all(r["passed"] for r in rows)
    (args.out / "tune_h200.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    table = markdown(rows, summary)
    (args.out / "tune_h200.md").write_text(table)
    print(json.dumps({"passed": summary["passed"], "seconds": round(summary["seconds"], 1), "gpu": summary["gpu"],
                      "onnxruntime": summary["environment"].get("onnxruntime"),
                      "cases": [{k: r[k] for k in ("case", "tuned_target", "tuned_iobinding", "tuned_instances",
                                                   "speedup_one_instance_vs_fastest_plain", "throughput",
                                                   "speedup_vs_fastest_plain", "speedup_vs_plain_fp32", "goal",
                                                   "tuned_accuracy", "passed")} for r in rows]}, indent=2, default=str))
    print()
    print(table)
    sys.exit(0 if summary["passed"] else 1)


def markdown(rows: list[dict], summary: dict) -> str:
    labels = ["plain fp32 (raw ORT)", "plain fp32 (onnxaccel)", "plain fp16 (onnxaccel)", PARALLEL_PLAIN,
              "tuned, 1 instance", "tuned"]
    lines = [f"GPU: {summary['gpu']}; onnxruntime {summary['environment'].get('onnxruntime')}; "
             f"{summary['seconds']:.0f} s in all", "",
             "| case | " + " | ".join(f"{label} items/s" for label in labels)
             + " | tuned configuration | tuned / fastest plain | goal | |",
             "|---|" + "---|" * (len(labels) + 4)]
    for r in rows:
        cells = [f"{r['throughput'][k]:,.0f}" if r["throughput"].get(k) else ("-" if k not in r["throughput"]
                 else "failed") for k in labels]
        ratio = r["speedup_vs_fastest_plain"]
        inst = f", {r['tuned_instances']} instances" if r["tuned_instances"] > 1 else ""
        lines.append(f"| {r['case']} | " + " | ".join(cells) + f" | `{r['tuned_target']}` "
                     f"{'IO binding' if r['tuned_iobinding'] else 'numpy'}"
                     f"{inst} | "
                     f"{f'{ratio:.2f}x' if ratio else '-'} | >= {r['goal']}x | {'pass' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
