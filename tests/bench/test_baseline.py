"""Baseline comparison: regressions and gains beyond noise, failures that appear or go away."""

from __future__ import annotations

import copy
import json

import numpy as np
from bench_helpers import cli

from onnxaccel.bench.baseline import compare_reports
from onnxaccel.bench.cells import CellResult, SweepCell
from onnxaccel.bench.report import BenchReport
from onnxaccel.bench.stats import LatencyStats


def cell(batch: int, center_ms: float | None, spread: float = 0.01, n: int = 200) -> CellResult:
    if center_ms is None:
        return CellResult(SweepCell("cpu", batch), "failed", "t", 0.0, error={"message": "boom", "hint": "h"})
    samples = np.random.default_rng(batch).normal(center_ms, spread * center_ms, size=n)
    stats = LatencyStats.from_ms(samples)
    return CellResult(SweepCell("cpu", batch), "ok", "t", 0.0, latency=stats,
                      timing={"throughput_items_per_s": batch / (stats.p50 / 1e3)})


def report(*cells: CellResult) -> BenchReport:
    return BenchReport(model={"source": "m"}, environment={}, settings={}, cells=list(cells))


def test_verdicts_beyond_noise():
    old = report(cell(1, 10.0), cell(2, 10.0), cell(3, 10.0), cell(4, 10.0), cell(5, None), cell(7, 10.0))
    new = report(cell(1, 12.0), cell(2, 8.0), cell(3, 10.2), cell(4, None), cell(5, 10.0), cell(6, 10.0))
    result = compare_reports(new, old, baseline_name="old.json")
    verdicts = {c.id.split("|")[1]: c.verdict for c in result.changes}
    assert verdicts == {"batch=1": "regression", "batch=2": "gain", "batch=3": "same", "batch=4": "now-failing",
                        "batch=5": "now-passing", "batch=6": "new", "batch=7": "missing"}
    assert len(result.regressions) == 2 and len(result.gains) == 2
    change = next(c for c in result.changes if c.verdict == "regression")
    assert change.change == change.new_p50_ms / change.old_p50_ms - 1 > 0.05


def test_noisy_runs_need_a_bigger_change():
    quiet = compare_reports(report(cell(1, 10.8, spread=0.01)), report(cell(1, 10.0, spread=0.01)))
    noisy = compare_reports(report(cell(1, 10.8, spread=0.6, n=30)), report(cell(1, 10.0, spread=0.6, n=30)))
    assert quiet.changes[0].verdict == "regression"
    assert noisy.changes[0].verdict == "same" and noisy.changes[0].noise > 0.08


def test_cli_baseline_marks_regressions_and_can_fail_ci(tmp_path, mlp_path):
    first = tmp_path / "old.json"
    args = ["bench", str(mlp_path), "-t", "cpu", "-b", "1,2", "--runs", "40", "--warmup", "3"]
    assert cli(*args, "--report", str(first)).returncode == 0
    # Make the baseline ten times as fast as this machine: every cell is now a regression, whatever the load.
    data = json.loads(first.read_text())
    faster = copy.deepcopy(data)
    for entry in faster["cells"]:
        entry["latency"] = {k: (v / 10 if k.endswith("_ms") else v) for k, v in entry["latency"].items()}
    first.write_text(json.dumps(faster))
    proc = cli(*args, "--baseline", str(first), "--report", str(tmp_path / "new.json"), "--fail-on-regression")
    assert proc.returncode == 1, proc.stderr
    assert "2 regression(s)" in proc.stdout
    saved = json.loads((tmp_path / "new.json").read_text())["baseline"]
    assert saved["regressions"] == 2 and {c["verdict"] for c in saved["changes"]} == {"regression"}
