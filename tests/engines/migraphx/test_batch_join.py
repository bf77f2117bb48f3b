"""A GPU batch job starts on its first instance once that one is warm; the second is built and warmed while the
first runs units, and takes units once warm (plan ``instances_at_load``; issue 36: the job waited for both
sessions' first runs, 5.9 s of its 6.9 s start-up on the H100). On the native MIGraphX engine's stand-in, a GPU
target that computes on the CPU (NOT EXECUTED ON AMD HARDWARE)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from onnxaccel.scale import BatchJob, load_results, run_batch
from onnxaccel.scale.worker import BatchWorker
from tests.scale.conftest import write_npy_shards


def test_the_job_runs_on_the_first_instance_while_the_second_joins(fake_mgx, mlp_file, tmp_path):
    data = write_npy_shards(tmp_path / "npy", shards=3, rows=40, row_shape=(4,))
    report = run_batch(BatchJob(str(mlp_file), str(data), str(tmp_path / "out"), target="migraphx@migraphx",
                                batch=8))
    assert report.plan["instances"] == 2 and report.plan["instances_at_load"] == 1
    notes = report.stages["notes"]
    assert any(n.startswith("units started on the first instance; instance 1 after ") for n in notes), notes
    got = load_results(tmp_path / "out")
    session = ort.InferenceSession(str(mlp_file), providers=["CPUExecutionProvider"])
    rows = np.concatenate([np.load(p) for p in sorted(data.glob("*.npy"))])
    np.testing.assert_allclose(got.outputs["probs"], session.run(None, {"x": rows})[0], rtol=1e-5, atol=1e-6)
    assert len(got.row_ids) == len(rows) > 100


def test_the_worker_counts_only_instances_in_service(fake_mgx, mlp_file, monkeypatch):
    """Units go to instances in service only: the pump round-robins over ``instances``, which grows as the
    second joins; ``planned_instances`` sizes what must hold every instance's unit (the page-locked slots)."""
    from onnxaccel.engines.pool import RunnerPool

    started = []
    real = RunnerPool.join_in_background
    monkeypatch.setattr(RunnerPool, "join_in_background", lambda self: started.append(self.in_service) or [])
    from onnxaccel.scale.job import BatchJob as Job, plan_job
    from onnxaccel.scale.worker import WorkerSpec
    from onnxaccel.scale.datasets import Dataset

    plan = plan_job(Job(str(mlp_file), "unused", "unused", target="migraphx@migraphx", batch=8))[0]
    worker = BatchWorker(WorkerSpec(str(mlp_file), plan, Dataset("arrays", "", ()), ()), instances=plan.instances)
    try:
        assert started == [1] and worker.instances == 1 and worker.planned_instances == 2
        assert worker.join_note() == "units started on the first instance; no other instance joined while it ran"
        for future in real(worker.pool):
            future.result()
        assert worker.instances == 2 and worker.pool.joining is None
        assert worker.join_note().startswith("units started on the first instance; instance 1 after ")
    finally:
        worker.close()
