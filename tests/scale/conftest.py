"""Datasets on disk (images, .npy shards, parquet), a local Ray cluster on loopback for the whole session, and the
`batch` command on a local Typer app.

The Ray cluster is small (2 CPUs, 500 MiB object store), bound to 127.0.0.1, and shut down when the session ends.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

# Read by ray when it is imported: bind a local cluster to loopback only (see onnxaccel/scale/cluster.py).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

BATCH_APP = ("import typer\nfrom onnxaccel.cli import batch\napp = typer.Typer()\n"
             "app.callback()(lambda: None)\nbatch.register(app)\napp()")


def _require(module: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed: the scale tests need pip install -e '.[ray,test]'")


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the session: 2 CPUs, 500 MiB object store, loopback only."""
    _require("ray")
    from onnxaccel.scale.cluster import ray_cluster as cluster_cm

    with cluster_cm("local", num_cpus=2, object_store_mb=500) as info:
        yield info


@pytest.fixture(scope="session")
def squeezenet():
    from onnxaccel import load_model

    load_model("zoo:squeezenet")  # build it once (seconds) before any timing matters
    return "zoo:squeezenet"


def write_npy_shards(folder: Path, shards: int, rows: int, row_shape: tuple[int, ...], seed: int = 0) -> Path:
    """``shards`` .npy files of ``rows`` float32 rows each (the last one shorter, to test partial units)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(shards):
        n = rows if i < shards - 1 else max(1, rows - 3)
        np.save(folder / f"part-{i:03d}.npy", rng.random((n, *row_shape), dtype=np.float32))
    return folder


def write_images(folder: Path, count: int, seed: int = 0) -> Path:
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(count):
        sub = folder / ("cats" if i % 2 else "dogs")
        sub.mkdir(parents=True, exist_ok=True)
        size = (40 + 7 * (i % 5), 30 + 5 * (i % 3))
        Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8)).save(sub / f"img-{i:03d}.png")
    return folder


@pytest.fixture
def npy_data(tmp_path) -> Path:
    return write_npy_shards(tmp_path / "npy", shards=3, rows=20, row_shape=(4,))


@pytest.fixture(scope="module")
def cli():
    """``cli(*args)``: ``onnxaccel batch ARGS`` through Typer's test runner (the real command)."""
    import typer
    from typer.testing import CliRunner

    from onnxaccel.cli import batch as batch_cli

    app = typer.Typer()
    app.callback()(lambda: None)
    batch_cli.register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["batch", *args])


def kill_after_shards(cmd: list[str], out, shards: int = 2, env: dict | None = None) -> int:
    """Start the batch command ``cmd`` writing to ``out``, SIGKILL it once ``shards`` shards are finished in
    its manifest (bounded: 120 s), and return how many the manifest holds after the kill. Every process the run
    started (decode workers, their resource tracker) must end with it."""
    import json
    import signal
    import subprocess
    import time

    from onnxaccel.scale.writer import MANIFEST
    from tests.process_tree import descendants, survivors

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    below: set[int] = set()
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                finished = json.loads((out / MANIFEST).read_text())["shards"]
            except (OSError, ValueError, KeyError):
                finished = {}
            if len(finished) >= shards:
                below = descendants(proc.pid)
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be interrupted"
    left = survivors(below)
    assert not left, f"processes {sorted(left)} of the killed run kept running"
    return len(json.loads((out / MANIFEST).read_text())["shards"])
