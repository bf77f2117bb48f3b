"""Benchmarks and tuning: timing loops, statistics, sweeps, reports, baselines, and `tune`.

Modules, one job each:

    timing        measure_call / measure (first call apart, warmup, grouped fast calls), measure_transfers
    concurrency   measure_concurrent: N requests in flight on one session
    stats         LatencyStats (min/mean/p50/p90/p95/p99/p99.9/max/stddev, CV), histograms
    cells         SweepCell (what one measurement is), CellResult, the grid of a sweep
    sweep         Sweep: runs cells, isolates failures, writes the report after every cell, resumes
    accuracy      AccuracyGate and the FP32 reference every non-FP32 cell is judged against
    gpu_specs     peak TFLOP/s and bandwidth of GPUs by precision, with sources
    roofline      achieved TFLOP/s, % of peak, arithmetic intensity
    device_metrics  GPU utilization / memory / power of the target's GPU (system.telemetry sampler)
    host          environment block, host RSS
    report        BenchReport (schema onnxaccel.bench/2), atomic writes, load_report
    report_text   CSV and Markdown;  report_html + svg: one self-contained HTML page with plots
    baseline      compare_reports: regressions and gains beyond noise
    tune          tune(): greedy search inside the accuracy gate;  tune_space: the knobs per device
    config        TunedConfig (schema onnxaccel.config/1), save_config, load_config

The names below are imported on first use, so ``import onnxaccel.bench`` stays light.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "measure": "timing", "measure_call": "timing", "TimingResult": "timing", "LatencyStats": "stats",
    "SweepCell": "cells", "CellResult": "cells", "grid": "cells", "Sweep": "sweep", "SweepSettings": "sweep",
    "AccuracyGate": "accuracy", "BenchReport": "report", "load_report": "report", "compare_reports": "baseline",
    "tune": "tune", "TuneSettings": "tune", "TuneResult": "tune", "TuneError": "tune", "TunedConfig": "config",
    "load_config": "config", "save_config": "config", "ConfigError": "config",
}

__all__ = [
    "AccuracyGate", "BenchReport", "CellResult", "ConfigError", "LatencyStats", "Sweep", "SweepCell",
    "SweepSettings", "TimingResult", "TuneError", "TuneResult", "TuneSettings", "TunedConfig", "compare_reports",
    "grid", "load_config", "load_report", "measure", "measure_call", "save_config", "tune",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"onnxaccel.bench.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'onnxaccel.bench' has no attribute {name!r}")
