"""A GPU batch job starts on its first instance once that one is warm; the second is built and warmed while the
first runs units, and takes units once warm, when the work left is worth it (plan ``instances_at_load``,
BatchWorker.join_if_worth: a joining instance's first run competes with the running one for the GPU, so a short
job ends sooner on one instance; docs/BENCHMARKS.md "Start-up"). On the native MIGraphX engine's stand-in, a GPU
target that computes on the CPU (NOT EXECUTED ON AMD HARDWARE)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from onnxaccel.scale import BatchJob, load_results, run_batch
from onnxaccel.scale import worker as worker_module
from onnxaccel.scale.datasets import Dataset
from onnxaccel.scale.job import plan_job
from onnxaccel.scale.worker import BatchWorker, WorkerSpec
from tests.scale.conftest import write_npy_shards


@pytest.mark.parametrize("worth, joins", [(0.0, True), (1e9, False)])
def test_the_job_starts_on_the_first_instance_and_the_second_joins_when_worth_it(fake_mgx, mlp_file, tmp_path,
                                                                                  monkeypatch, worth, joins):
    monkeypatch.setattr(worker_module, "JOIN_WORTH", worth)
    data = write_npy_shards(tmp_path / "npy", shards=3, rows=40, row_shape=(4,))
    report = run_batch(BatchJob(str(mlp_file), str(data), str(tmp_path / "out"), target="migraphx@migraphx",
                                batch=8))
    assert report.plan["instances"] == 2 and report.plan["instances_at_load"] == 1
    notes = report.stages["notes"]
    if joins:
        assert any(n.startswith("1 more instance(s) joining: the work left") for n in notes), notes
        # whether it was warm before the last unit depends on the machine: test_the_worker_counts_... checks it
        assert report.stages["run_instances"] == 2
    else:
        assert any(n.startswith("one instance: the work left") for n in notes), notes
        assert not any("joined while it ran" in n for n in notes)
        assert report.stages["run_instances"] == 1
    got = load_results(tmp_path / "out")
    session = ort.InferenceSession(str(mlp_file), providers=["CPUExecutionProvider"])
    rows = np.concatenate([np.load(p) for p in sorted(data.glob("*.npy"))])
    np.testing.assert_allclose(got.outputs["probs"], session.run(None, {"x": rows})[0], rtol=1e-5, atol=1e-6)
    assert len(got.row_ids) == len(rows) > 100


def test_the_worker_counts_only_instances_in_service(fake_mgx, mlp_file):
    """Units go to instances in service only: the pump round-robins over ``instances``, which grows as the
    second joins; ``planned_instances`` sizes what must hold every instance's unit (the page-locked slots)."""
    plan = plan_job(BatchJob(str(mlp_file), "unused", "unused", target="migraphx@migraphx", batch=8))[0]
    worker = BatchWorker(WorkerSpec(str(mlp_file), plan, Dataset("arrays", "", ()), ()), instances=plan.instances)
    try:
        assert worker.instances == 1 and worker.planned_instances == 2 and worker.joins == []
        assert worker.join_note() == ""
        note = worker.join_if_worth(1e9)
        assert note.startswith("1 more instance(s) joining")
        for future in worker.joins:
            future.result()
        assert worker.instances == 2 and worker.pool.joining is None
        assert worker.join_note().startswith("units started on the first instance; instance 1 after ")
    finally:
        worker.close()


def test_a_short_job_stays_on_one_instance(fake_mgx, mlp_file):
    plan = plan_job(BatchJob(str(mlp_file), "unused", "unused", target="migraphx@migraphx", batch=8))[0]
    worker = BatchWorker(WorkerSpec(str(mlp_file), plan, Dataset("arrays", "", ()), ()), instances=plan.instances)
    try:
        note = worker.join_if_worth(0.0)
        assert note.startswith("one instance: the work left (about 0.0 s) ends before another would be warm")
        assert worker.joins == [] and worker.planned_instances == 1 and worker.pool.joining is None
    finally:
        worker.close()
