"""Kill a real `onnxaccel bench` sweep mid-way with SIGKILL; the report keeps what finished; --resume does
only the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from bench_helpers import cli

SWEEP = ["-t", "cpu", "-b", "1,2,3,4,5,6", "--iobinding", "both", "--duration", "0.3", "--warmup", "2"]
TOTAL = 12


def read_cells(path) -> list[dict]:
    try:
        return json.loads(path.read_text())["cells"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return []


def test_sigkill_mid_sweep_keeps_finished_cells_and_resume_skips_them(tmp_path, mlp_path):
    report = tmp_path / "sweep.json"
    args = ["bench", str(mlp_path), *SWEEP, "--report", str(report), "--report", str(tmp_path / "sweep.html")]
    proc = subprocess.Popen([sys.executable, "-m", "onnxaccel.cli.main", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "200"})
    try:
        deadline = time.monotonic() + 120
        while len(read_cells(report)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "the sweep finished before it could be killed; make its cells slower"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    # Every write was atomic: the file is complete JSON, with the cells that finished before the kill.
    data = json.loads(report.read_text())
    finished = {c["id"]: c for c in data["cells"]}
    assert 3 <= len(finished) < TOTAL and data["complete"] is False
    assert all(c["status"] == "ok" for c in finished.values())

    resumed = cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.count("done before, skipped") == len(finished)
    final = json.loads(report.read_text())
    assert final["complete"] is True and len(final["cells"]) == TOTAL
    by_id = {c["id"]: c for c in final["cells"]}
    for cell_id, before in finished.items():  # untouched: same start time and samples as before the kill
        assert by_id[cell_id]["started"] == before["started"]
        assert by_id[cell_id]["samples_ms"] == before["samples_ms"]
    html = (tmp_path / "sweep.html").read_text()
    assert html.count("<tr>") >= TOTAL and "complete" in html


def test_resume_needs_the_json_report(tmp_path, mlp_path):
    proc = cli("bench", str(mlp_path), "-t", "cpu", "--resume", "--report", str(tmp_path / "r.html"))
    assert proc.returncode == 2 and "--resume needs the JSON report" in proc.stderr and "hint:" in proc.stderr
