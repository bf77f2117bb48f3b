"""FP32 / FP16 / INT8 side by side: speed and accuracy of each precision `onnxaccel optimize` produces.

For every model: the FP32 original, `optimize --fp16` (converted, FP32 inputs/outputs) and `optimize --int8`
(static QDQ for CNNs, dynamic for transformers) are timed on the target with IO binding, and their outputs are
compared with the FP32 original on the CPU provider (the gate `optimize` runs). Zoo models carry seeded random
weights, so "accuracy" here is agreement with FP32, not task accuracy; INT8 is calibrated on synthesized inputs
unless --calibration is given, and the table says so.

  python benchmarks/optimize_precisions.py --target cpu  --models zoo:squeezenet,zoo:resnet50,zoo:bert-tiny
  python benchmarks/optimize_precisions.py --target cuda --batch 8 \
      --models zoo:squeezenet,zoo:resnet50,zoo:densenet121,zoo:bert-base

Prints a Markdown table (stdout) and writes OUT/optimize_precisions.json (and the converted models).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DEFAULT_MODELS = "zoo:squeezenet,zoo:resnet50,zoo:bert-tiny"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from onnxaccel.bench.host import environment, utc_now
    from onnxaccel.target import parse_target

    out = Path(args.out)
    (out / "models").mkdir(parents=True, exist_ok=True)
    target = parse_target(args.target)
    rows = []
    for source in [m.strip() for m in args.models.split(",") if m.strip()]:
        rows.extend(_model_rows(source, target, args, out / "models"))
    report = {"schema": "onnxaccel.optimize-precisions/1", "date": utc_now(), "command": " ".join(sys.argv),
              "environment": environment(), "target": str(target), "batch": args.batch, "runs": args.runs,
              "rows": rows}
    (out / "optimize_precisions.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    print(markdown(rows))
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=DEFAULT_MODELS, help="Comma-separated zoo:NAME or .onnx paths.")
    p.add_argument("--target", default="cpu", help="cpu or cuda[:ID] (the CUDA EP).")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--shape", action="append", default=[], help="NAME=1x3x224x224 or DIM=128 (all models); repeatable.")
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--eval-samples", type=int, default=8)
    p.add_argument("--calibration", default="synthetic", help="Calibration data for static INT8 (all CNN models).")
    p.add_argument("--eval-data", default=None, help="Inputs for the accuracy comparison (all models).")
    p.add_argument("--mean", default=None, help="Image mean for --calibration/--eval-data folders of images.")
    p.add_argument("--std", default=None)
    p.add_argument("--resize", type=int, default=None)
    p.add_argument("--precisions", default="fp32,fp16,int8")
    p.add_argument("--out", default="benchmark-results/optimize_precisions")
    p.add_argument("--json", action="store_true", help="Also print the JSON report.")
    return p


def _model_rows(source: str, target, args, folder: Path) -> list[dict]:
    from onnxaccel.model import load_model
    from onnxaccel.transform.graph import is_transformer

    from onnxaccel.model import parse_shape_bindings

    model = load_model(source)
    args.shapes = parse_shape_bindings(args.shape)
    bound = model.bind(args.shapes, batch=args.batch)
    transformer = is_transformer(model.proto)
    rows, base = [], None
    for precision in [p.strip() for p in args.precisions.split(",")]:
        label = source if source.startswith("zoo:") else Path(source).name
        row = {"model": label, "precision": precision, "target": str(target), "batch": args.batch}
        try:
            path, report, seconds = _convert(model, precision, transformer, target, args, folder)
            row.update(_accuracy(report))
            row["convert_seconds"] = round(seconds, 2)
            row["mode"] = _mode(precision, transformer, args)
            row.update(_timing(path, bound, target, args))
            row["size_mb"] = round(Path(path).stat().st_size / 1e6, 2)
        except Exception as exc:  # noqa: BLE001 - one failing cell must not hide the others
            row["error"] = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"
        if precision == "fp32" and "p50_ms" in row:
            base = row["p50_ms"]
        if base and "p50_ms" in row:
            row["speedup_vs_fp32"] = round(base / row["p50_ms"], 2)
        rows.append(row)
        print(f"{source} {precision}: {json.dumps({k: row.get(k) for k in ('p50_ms', 'max_abs', 'top1', 'error')})}",
              file=sys.stderr)
    return rows


def _mode(precision: str, transformer: bool, args) -> str:
    if precision == "fp16":
        return "converted, FP32 I/O"
    if precision == "int8":
        if transformer:
            return "dynamic (MatMul/Attention)"
        given = "synthetic" if args.calibration == "synthetic" else "given"
        return f"static QDQ, MinMax, per-channel, calibration={given}"
    return "original"


def _convert(model, precision: str, transformer: bool, target, args, folder: Path):
    """The model file for ``precision`` and the optimize report (accuracy vs FP32 on the CPU)."""
    from onnxaccel.analysis.bisect import find_divergence
    from onnxaccel.cli.optimize import _preprocess, default_gate
    from onnxaccel.precision.int8 import Int8Settings
    from onnxaccel.transform.optimize import OptimizeOptions, optimize

    name = model.name.replace("/", "_")
    out = folder / f"{name}-{precision}.onnx"
    int8 = None
    if precision == "int8":
        int8 = Int8Settings(mode="dynamic", per_channel=False) if transformer else Int8Settings(mode="static")
    options = OptimizeOptions(
        output=out, target=target, force=True, batch=args.batch, shapes=args.shapes,
        graph_level="none" if precision == "fp32" else "auto",
        fp16=precision == "fp16", int8=int8,
        calibration=args.calibration if int8 and int8.mode == "static" else None,
        preprocess=_preprocess(args.mean, args.std, args.resize, "nchw", False),
        eval_data=args.eval_data, eval_samples=args.eval_samples,
        gate=default_gate(precision, None, None, None, None, 1), compile_cache=False,
    )
    start = time.perf_counter()
    report = optimize(model, options, find_divergence)
    return out, report, time.perf_counter() - start


def _accuracy(report) -> dict:
    outputs = report.accuracy.get("comparison", {}).get("outputs", [])
    top1 = [o["topk"]["top1"] for o in outputs if o.get("topk")]
    return {"max_abs": max((o["max_abs"] for o in outputs), default=None),
            "cosine": min((o["cosine"] for o in outputs), default=None),
            "top1": min(top1) if top1 else None, "gate_passed": report.passed,
            "judged_on": report.accuracy.get("candidate_target"),
            "eval_samples": report.accuracy.get("samples", {}).get("source"),
            "synthetic_calibration": bool(report.precision.get("calibration", {}).get("synthetic"))}


def _timing(path: Path, bound, target, args) -> dict:
    import dataclasses

    from onnxaccel.bench.timing import measure
    from onnxaccel.engines import compile_model
    from onnxaccel.inputs import synthesize
    from onnxaccel.transform.evaluate import model_at

    model = model_at(path, bound)
    runner = compile_model(model, dataclasses.replace(target, precision="fp32"))
    try:
        timing = measure(runner, synthesize(bound), batch=args.batch, warmup=args.warmup, runs=args.runs)
        return {"p50_ms": round(timing.latency.p50, 3), "mean_ms": round(timing.latency.mean, 3),
                "p99_ms": round(timing.latency.p99, 3), "throughput": round(timing.throughput, 1),
                "session_seconds": round(runner.compile_seconds, 3), "placement": runner.placement.summary(),
                "fallback_nodes": len(runner.placement.fallback)}
    finally:
        runner.close()


def markdown(rows: list[dict]) -> str:
    head = ("| model | precision | mode | p50 ms | speedup | items/s | size MB | max abs err | cosine | top-1 agree "
            "| gate | fallback |")
    lines = [head, "|" + "|".join(["---"] * 12) + "|"]

    def f(value, spec):
        return "-" if value is None else format(value, spec)

    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['precision']} | error: {r['error'][:80]} |" + " |" * 9)
            continue
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['mode']} | {f(r.get('p50_ms'), '.3f')} | "
            f"{f(r.get('speedup_vs_fp32'), '.2f')}x | {f(r.get('throughput'), ',.1f')} | "
            f"{f(r.get('size_mb'), '.1f')} | "
            f"{f(r.get('max_abs'), '.3g')} | {f(r.get('cosine'), '.5f')} | "
            f"{'-' if r.get('top1') is None else format(r['top1'], '.1%')} | "
            f"{'pass' if r.get('gate_passed') else 'FAIL'} | {r.get('fallback_nodes', '-')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
