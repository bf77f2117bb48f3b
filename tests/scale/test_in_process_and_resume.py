"""The in-process path computes what ONNX Runtime computes for the same rows, and a run killed mid-way resumes:
finished shards are skipped, the rest is computed, and the result equals an uninterrupted run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort

from onnxaccel.scale import BatchJob, load_results, run_batch
from tests.scale.conftest import BATCH_APP, kill_after_shards, write_npy_shards


def test_outputs_match_onnx_runtime_row_for_row(tmp_path, mlp_path, npy_data):
    report = run_batch(BatchJob(str(mlp_path), str(npy_data), str(tmp_path / "out"), target="cpu", batch=8))
    assert (report.rows_done, report.shards_done, report.rows_skipped) == (57, 3, 0)
    got = load_results(tmp_path / "out")
    session = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"])
    ids, expected = [], []
    for path in sorted(npy_data.glob("*.npy")):
        rows = np.load(path)
        for start in range(0, len(rows), 8):  # the same batch composition as the job
            expected.append(session.run(None, {"x": rows[start:start + 8]})[0])
        ids += [f"{path.name}:{i}" for i in range(len(rows))]
    assert got.row_ids == ids
    np.testing.assert_array_equal(got.outputs["probs"], np.concatenate(expected))


def test_killed_run_resumes_skipping_finished_shards(tmp_path, squeezenet):
    data = write_npy_shards(tmp_path / "npy", shards=8, rows=8, row_shape=(3, 224, 224))
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", BATCH_APP, "batch", squeezenet, "--input", str(data), "--output", str(out),
           "--target", "cpu", "--batch", "4", "--json"]
    killed_at = kill_after_shards(cmd, out)
    assert 2 <= killed_at < 8

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["shards"] == {"total": 8, "done": 8 - killed_at, "skipped": killed_at}
    assert report["rows"]["done"] + report["rows"]["skipped"] == report["rows"]["total"] == 8 * 8 - 3
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]

    clean = tmp_path / "clean"
    run_batch(BatchJob(squeezenet, str(data), str(clean), target="cpu", batch=4))
    resumed, reference = load_results(out), load_results(clean)
    assert resumed.row_ids == reference.row_ids and len(set(resumed.row_ids)) == len(resumed.row_ids)
    np.testing.assert_array_equal(resumed.outputs["softmaxout_1"], reference.outputs["softmaxout_1"])
