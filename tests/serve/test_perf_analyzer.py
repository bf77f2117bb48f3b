"""Triton's own load generator, perf_analyzer (the binary in the tritonclient 2.41 wheel, .venv/bin/perf_analyzer),
against a real `onnxaccel serve` on loopback: HTTP and gRPC, tensors in the body, in system shared memory
(``--shared-memory system``) and over the gRPC stream (``--streaming``). Each run must end with rc 0, a
measured throughput, and the server-side statistics perf_analyzer reads back (it aborts when their counts
disagree). The shared libraries the binary needs and this machine lacks (libcudart.so.12, libb64.so.0d) are
in .venv/perflibs/lib (Makefile, `.installed-perflibs`).
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve.conftest import ServerProcess

pytest.importorskip("tritonclient.http")

PERF_ANALYZER = Path(sys.executable).parent / "perf_analyzer"
LIBS = Path(sys.executable).parent.parent / "perflibs" / "lib"


def _perf_analyzer_env() -> dict:
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(LIBS),
                                                                         os.environ.get("LD_LIBRARY_PATH")]))}
    if not PERF_ANALYZER.exists():
        pytest.skip(f"{PERF_ANALYZER} is not here (the tritonclient wheel installs it)")
    probe = subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True, text=True, env=env, timeout=60)
    if "error while loading shared libraries" in probe.stderr:
        pytest.skip(f"perf_analyzer cannot load: {probe.stderr.strip()} (make .venv/.installed-perflibs)")
    return env


@pytest.fixture(scope="module")
def server(tmp_path_factory, mlp_path):
    tmp = tmp_path_factory.mktemp("perf-analyzer")
    server = ServerProcess(mlp_path, "--shared-memory", "system", "--max-batch", "8",
                           log=tmp / "serve.log").wait_ready(120)
    yield server
    assert server.stop(60) == 0, server.log()


CASES = {
    "http": [],
    "http-system-shm": ["--shared-memory", "system"],
    "grpc": ["-i", "grpc"],
    "grpc-streaming": ["-i", "grpc", "--streaming"],
    "grpc-system-shm": ["-i", "grpc", "--shared-memory", "system"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_perf_analyzer_measures_onnxaccel_serve(server, tmp_path, case):
    env = _perf_analyzer_env()
    url = server.grpc_url if "-i" in CASES[case] else server.url.removeprefix("http://")
    report = tmp_path / "pa.csv"
    cmd = [str(PERF_ANALYZER), "-m", "mlp", "-u", url, *CASES[case], "--shape", "x:1,4",
           "--concurrency-range", "2", "-p", "500", "--max-trials", "4", "--stability-percentage", "999",
           "-f", str(report)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(cmd)}\n{output}\n{server.log()[-3000:]}"
    assert "error" not in output.lower(), output
    assert "Server:" in output and "Inference count:" in output, output  # the statistics were read back
    rows = list(csv.DictReader(report.read_text().splitlines()))
    assert len(rows) == 1 and rows[0]["Concurrency"] == "2", rows
    assert float(rows[0]["Inferences/Second"]) > 0
    assert int(rows[0]["Server Compute Infer"]) > 0, rows[0]  # server-side time in the model, in usec

