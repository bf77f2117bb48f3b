"""Fixtures for the bench tests: one real CPU sweep, run once per session and shared (it is the slow part)."""

from __future__ import annotations

from pathlib import Path

import pytest
from model_builders import make_mlp

from onnxaccel.bench.cells import grid
from onnxaccel.bench.sweep import Sweep, SweepSettings


@pytest.fixture(scope="session")
def fixed_batch_path(tmp_path_factory) -> Path:
    """The tiny MLP with its batch axis fixed to 1: a model that refuses other batch sizes."""
    return make_mlp(tmp_path_factory.mktemp("models") / "mlp-b1.onnx", batch=1)


@pytest.fixture(scope="session")
def cpu_sweep(tmp_path_factory, mlp_path):
    """A real sweep on the CPU: 2 precisions x 2 batches x IO binding on/off, plus a target that cannot load
    here (CUDA), written to every report format as it runs."""
    out = tmp_path_factory.mktemp("sweep")
    paths = [out / "report.json", out / "report.csv", out / "report.md", out / "report.html"]
    cells, skipped = grid(["cpu", "cuda"], precisions=["fp32", "int8"], batches=[1, 4],
                          iobinding=[True, False], graph=[False, True])
    events = []
    sweep = Sweep(str(mlp_path), SweepSettings(warmup=3, runs=30), paths, on_event=events.append)
    sweep.report.skipped = [s.to_dict() for s in skipped]
    results = sweep.run(cells)
    sweep.report.complete = True
    sweep.write()
    return {"sweep": sweep, "results": results, "paths": dict(zip(("json", "csv", "md", "html"), paths)),
            "events": events, "cells": cells, "skipped": skipped}
