"""`batch --ray` on a real local Ray cluster (2 CPUs, loopback): the same rows and values as in-process, and a
worker killed mid-run costs no row and duplicates none."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from onnxaccel.cli import batch as batch_cli
from onnxaccel.scale import BatchJob, load_results, run_batch
from tests.scale.conftest import write_images, write_npy_shards

OUT = "softmaxout_1"


def test_ray_output_is_identical_to_in_process(tmp_path, ray_cluster, squeezenet):
    """Same shards, same row ids, bit-identical values: every unit is computed with the same batch composition
    (units start at multiples of --batch inside their shard), and ONNX Runtime's CPU kernels give each row the
    same result whatever the number of intra-op threads (2 in-process, 1 per actor here). Each actor runs two units
    at once in threads here, as it does on GPUs."""
    data = write_npy_shards(tmp_path / "npy", shards=3, rows=10, row_shape=(3, 224, 224))
    local = run_batch(BatchJob(squeezenet, str(data), str(tmp_path / "local"), target="cpu", batch=4))
    ray = run_batch(BatchJob(squeezenet, str(data), str(tmp_path / "ray"), target="cpu", batch=4, ray="auto",
                             calls_per_worker=2))
    assert ray.runner == "ray" and ray.ray["cluster"]["started_here"] is False
    assert ray.ray["pool"]["workers"] == 2 and ray.ray["pool"]["calls_per_worker"] == 2
    assert (ray.rows_done, ray.shards_done) == (local.rows_done, local.shards_done) == (27, 3)
    a, b = load_results(tmp_path / "local"), load_results(tmp_path / "ray")
    assert a.row_ids == b.row_ids
    np.testing.assert_array_equal(a.outputs[OUT], b.outputs[OUT])
    assert sum(w.rows for w in ray.workers) == 27  # (an actor that starts late may get no unit: not asserted)


def test_images_on_ray_keep_their_path_ids(tmp_path, ray_cluster, squeezenet):
    folder = write_images(tmp_path / "imgs", 10)
    report = run_batch(BatchJob(squeezenet, str(folder), str(tmp_path / "out"), target="cpu", batch=4,
                                images_per_shard=4, ray="auto"))
    got = load_results(tmp_path / "out")
    assert report.shards_done == 3 and got.row_ids == sorted(got.row_ids) and got.row_ids[0] == "cats/img-001.png"
    assert got.outputs[OUT].shape == (10, 1000, 1, 1)
    np.testing.assert_allclose(got.outputs[OUT].sum(axis=1).ravel(), 1.0, rtol=1e-4)  # softmax rows


@pytest.mark.slow
def test_an_actor_killed_mid_run_loses_and_duplicates_no_row(tmp_path, ray_cluster, squeezenet):
    data = write_npy_shards(tmp_path / "npy", shards=6, rows=8, row_shape=(3, 224, 224))
    killed = {}

    def kill_first_worker(progress) -> None:
        if progress.worker and not killed:
            pid = int(progress.worker.rsplit(":", 1)[1])
            assert pid != os.getpid()
            os.kill(pid, signal.SIGKILL)
            killed.update(pid=pid, rows_done=progress.rows_done, rows_total=progress.rows_total)

    report = run_batch(BatchJob(squeezenet, str(data), str(tmp_path / "ray"), target="cpu", batch=2, ray="auto"),
                       progress=kill_first_worker)
    assert killed and killed["rows_done"] < killed["rows_total"] / 2, killed
    with pytest.raises(ProcessLookupError):
        os.kill(killed["pid"], 0)  # the actor really died; Ray Data restarted it and retried its task
    got = load_results(tmp_path / "ray")
    expected_ids = [f"part-{s:03d}.npy:{r}" for s in range(6) for r in range(8 if s < 5 else 5)]
    assert got.row_ids == expected_ids  # every row once, none twice, in shard order
    reference = run_batch(BatchJob(squeezenet, str(data), str(tmp_path / "local"), target="cpu", batch=2))
    assert reference.rows_done == report.rows_done == len(expected_ids)
    np.testing.assert_array_equal(got.outputs[OUT], load_results(tmp_path / "local").outputs[OUT])


def test_cli_batch_on_ray_prints_the_throughput_report(tmp_path, ray_cluster, mlp_path, npy_data):
    app = typer.Typer()
    app.callback()(lambda: None)
    batch_cli.register(app)
    result = CliRunner().invoke(app, ["batch", str(mlp_path), "--input", str(npy_data), "--output",
                                      str(tmp_path / "out"), "--target", "cpu", "--ray", "auto", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "onnxaccel.batch/1" and report["runner"] == "ray"
    assert report["rows"] == {"total": 57, "done": 57, "skipped": 0, "failed": 0} and report["rows_per_s"] > 0
    assert report["ray"]["cluster"]["address"].startswith("127.0.0.1:")  # loopback only
    text = CliRunner().invoke(app, ["batch", str(mlp_path), "--input", str(npy_data), "--output",
                                    str(tmp_path / "out"), "--target", "cpu", "--ray", "auto"])
    assert text.exit_code == 0 and "finished before and skipped" in " ".join(text.output.split())
