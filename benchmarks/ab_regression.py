"""The pieces of benchmarks/ab_regression.sh that are Python: the .npy rows, reading each report into rows of a CSV,
and the table of the A/B (old tree against new) at the end.

    python benchmarks/ab_regression.py npy DIR ROWS                     # uint8 224x224x3 rows, shards of 2,048
    python benchmarks/ab_regression.py record CSV ROUND SIDE KIND REPORT  # KIND: bench, batch or serve
    python benchmarks/ab_regression.py table CSV [--json OUT]

`record` appends one row per figure (round, side, metric, value, unit, time) and fails (exit 1) when the report
holds an error, a failed cell, a request answered with an error or a figure is missing. `table` prints, per metric,
each side's values, their mean, the spread within each side ((max - min) / mean) and new / old; a ratio on the bad
side of 1 by more than both spreads and 3 % is marked "check". Higher is better for rates; lower for ms and s.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import time
from pathlib import Path

FIELDS = ["round", "side", "metric", "value", "unit", "time"]


def make_npy(folder: str, rows: int, per_shard: int = 2048) -> None:
    import numpy as np

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    if sum(np.load(f, mmap_mode="r").shape[0] for f in out.glob("*.npy")) == rows:
        return
    for f in out.glob("*.npy"):
        f.unlink()
    rng = np.random.default_rng(0)
    for i, start in enumerate(range(0, rows, per_shard)):
        n = min(per_shard, rows - start)
        np.save(out / f"part-{i:04d}.npy", rng.integers(0, 256, (n, 224, 224, 3), dtype=np.uint8))


def bench_rows(report: dict) -> list[tuple[str, float, str]]:
    cells = report.get("cells") or []
    bad = [c for c in cells if c.get("status") != "ok" or c.get("error")]
    if not cells or bad:
        raise SystemExit(f"bench: {len(cells)} cells, failed: {[(c.get('batch'), c.get('error')) for c in bad]}")
    rows = []
    for c in cells:
        b = c["batch"]
        rows.append((f"bench_b{b}_img_s", c["throughput_items_per_s"], "img/s"))
        rows.append((f"bench_b{b}_p50_ms", c["latency"]["p50_ms"], "ms"))
    return rows


def batch_rows(report: dict) -> list[tuple[str, float, str]]:
    if "error" in report or not report.get("rows_per_s"):
        raise SystemExit(f"batch: no rate in the report: {json.dumps(report)[:600]}")
    rows = [("batch_npy_rows_s_steady", report["rows_per_s"], "rows/s"),
            ("batch_npy_rows_s_all_in", report["rows_per_s_wall"], "rows/s")]
    if report.get("startup_s") is not None:
        rows.append(("batch_npy_startup_s", report["startup_s"], "s"))
    return rows


def serve_rows(report: dict) -> list[tuple[str, float, str]]:
    runs = report.get("runs") or []
    if not runs:
        raise SystemExit("serve: no server run in the report")
    run = runs[0]
    levels = run.get("levels") or [{"concurrency": report["args"]["concurrency"],
                                    "inferences_per_s": run["server"]["inferences_per_s"],
                                    "p99_ms": (run["server"]["latency"] or {}).get("p99_ms"),
                                    "errors": run["server"]["error_count"]}]
    rows = []
    for level in levels:
        c = level["concurrency"]
        if level["errors"] or not level["inferences_per_s"]:
            raise SystemExit(f"serve: concurrency {c}: {level['errors']} errors, {level['inferences_per_s']} infer/s")
        rows.append((f"serve_c{c}_infer_s", level["inferences_per_s"], "infer/s"))
        if level.get("p99_ms") is not None:
            rows.append((f"serve_c{c}_p99_ms", level["p99_ms"], "ms"))
    if run.get("server_ready_s") is not None:
        rows.append(("serve_ready_s", run["server_ready_s"], "s"))
    return rows


def record(csv_path: str, round_: str, side: str, kind: str, report_path: str) -> None:
    text = Path(report_path).read_text()
    try:
        report = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{kind}: {report_path} is not JSON ({exc}): {text[:400]!r}")
    rows = {"bench": bench_rows, "batch": batch_rows, "serve": serve_rows}[kind](report)
    new = not Path(csv_path).exists()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    with open(csv_path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(FIELDS)
        for metric, value, unit in rows:
            w.writerow([round_, side, metric, f"{value:.6g}", unit, stamp])
    print(f"  round {round_} {side}: " + ", ".join(f"{m} {v:,.4g}" for m, v, _ in rows), flush=True)


def lower_is_better(metric: str) -> bool:
    rate = metric.endswith(("_img_s", "_infer_s", "_rows_s"))
    return metric.endswith("_ms") or (metric.endswith("_s") and not rate)


def table(csv_paths: list[str], json_out: str | None = None) -> int:
    values: dict[str, dict[str, list[float]]] = {}
    order: list[str] = []
    for path in csv_paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["metric"] not in values:
                    order.append(row["metric"])
                values.setdefault(row["metric"], {}).setdefault(row["side"], []).append(float(row["value"]))
    header = f"{'metric':28} {'old (each round)':>22} {'new (each round)':>22} {'old mean':>10} {'new mean':>10} " \
             f"{'spread old':>10} {'spread new':>10} {'new/old':>8}"
    print(header)
    print("-" * len(header))
    summary, flagged = [], []
    for metric in order:
        old, new = values[metric].get("old", []), values[metric].get("new", [])
        mo = statistics.mean(old) if old else float("nan")
        mn = statistics.mean(new) if new else float("nan")
        so = (max(old) - min(old)) / mo if len(old) > 1 and mo else 0.0
        sn = (max(new) - min(new)) / mn if len(new) > 1 and mn else 0.0
        ratio = mn / mo if old and new and mo else float("nan")
        worse = (1 - ratio) if not lower_is_better(metric) else (ratio - 1)
        mark = "check" if worse > max(so, sn, 0.03) else ""
        if mark:
            flagged.append(metric)
        fmt = (lambda xs: " / ".join(f"{x:,.4g}" for x in xs) or "-")
        print(f"{metric:28} {fmt(old):>22} {fmt(new):>22} {mo:>10,.4g} {mn:>10,.4g} {so:>10.1%} {sn:>10.1%} "
              f"{ratio:>8.3f} {mark}")
        summary.append({"metric": metric, "old": old, "new": new, "old_mean": mo, "new_mean": mn,
                        "spread_old": so, "spread_new": sn, "new_over_old": ratio, "check": bool(mark),
                        "lower_is_better": lower_is_better(metric)})
    print(f"\n{len(flagged)} metric(s) worse in the new tree by more than the spread within each side and 3 %"
          + (f": {', '.join(flagged)}" if flagged else ""))
    if json_out:
        Path(json_out).write_text(json.dumps({"metrics": summary, "flagged": flagged}, indent=2))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "npy":
        make_npy(argv[1], int(argv[2]))
        return 0
    if len(argv) == 6 and argv[0] == "record":
        record(*argv[1:])
        return 0
    if len(argv) >= 2 and argv[0] == "table":
        paths = [a for a in argv[1:] if not a.startswith("--")]
        out = argv[argv.index("--json") + 1] if "--json" in argv else None
        if out:
            paths.remove(out)
        return table(paths, out)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
