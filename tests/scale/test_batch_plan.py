"""`batch` from Python (run_batch) runs what its ExecutionPlan says, as the CLI does: the preprocessing it was
asked to embed is embedded (it used to be embedded only by the CLI), and the report carries the plan."""

from __future__ import annotations

import io

from PIL import Image

from onnxaccel.inputs import PreprocessRequest
from onnxaccel.scale import BatchJob, run_batch


def _jpegs(folder, photo, count=4):
    folder.mkdir()
    for i in range(count):
        buffer = io.BytesIO()
        Image.open(photo("chelsea.png" if i % 2 else "coffee.png")).convert("RGB").save(buffer, "JPEG")
        (folder / f"p{i}.jpg").write_bytes(buffer.getvalue())
    return folder


def test_run_batch_from_python_embeds_the_preprocessing_it_was_given(tmp_path, squeezenet, photo):
    images = _jpegs(tmp_path / "images", photo)
    report = run_batch(BatchJob(squeezenet, str(images), str(tmp_path / "out"), target="cpu", batch=2,
                                preprocess=PreprocessRequest(preset="imagenet"), embed_preprocess="imagenet"))
    assert report.rows_done == 4 and not report.errors
    assert report.embedded is not None and report.embedded["preset"] == "imagenet"
    assert report.plan["embed_preprocess"] == "imagenet" and report.plan["command"] == "batch"
    assert report.model == squeezenet  # reports name the model the user gave, not the cached copy
    assert any("embedded in the model" in w for w in report.warnings)


def test_run_batch_on_the_cpu_keeps_host_preprocessing_and_says_why(tmp_path, squeezenet, photo):
    images = _jpegs(tmp_path / "images", photo, count=2)
    report = run_batch(BatchJob(squeezenet, str(images), str(tmp_path / "out"), target="cpu", batch=2,
                                preprocess=PreprocessRequest(preset="imagenet")))
    assert report.embedded is None and report.plan["embed_preprocess"] is None
    reason = next(c["reason"] for c in report.plan["choices"] if c["name"] == "embed_preprocess")
    assert "CPU target" in reason


def test_a_batch_report_says_where_its_start_up_went(tmp_path, squeezenet, photo):
    from onnxaccel import startup

    startup.reset()
    images = _jpegs(tmp_path / "images", photo, count=2)
    report = run_batch(BatchJob(squeezenet, str(images), str(tmp_path / "out"), target="cpu", batch=2,
                                preprocess=PreprocessRequest(preset="imagenet")))
    started = report.to_dict()["startup"]
    stages = {row["stage"] for row in started["stages"]}
    assert {"model read", "session", "workers", "decoder warm-up"} <= stages, stages
    assert 0 < started["to_first_result_s"]
    assert report.to_dict()["rows_per_s_wall"] <= report.to_dict()["rows_per_s"]  # all-in and steady, both


def test_a_batch_job_reads_each_model_file_once(tmp_path, squeezenet, photo):
    """The source once and the embedded copy once (plan_job, embedded_copy, the decoder planning and the worker
    each read them again before; a large model's read is a visible part of start-up)."""
    from onnxaccel import startup

    startup.reset()
    images = _jpegs(tmp_path / "images", photo, count=2)
    report = run_batch(BatchJob(squeezenet, str(images), str(tmp_path / "out"), target="cpu", batch=2,
                                preprocess=PreprocessRequest(preset="imagenet"), embed_preprocess="imagenet"))
    reads = [s["detail"] for s in report.to_dict()["startup"]["spans"] if s["stage"] == "model read"]
    assert len(reads) == 2 and reads[0] != reads[1], reads
    assert report.rows_done == 2 and report.embedded["preset"] == "imagenet"
