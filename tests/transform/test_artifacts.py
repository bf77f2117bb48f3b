"""Artifacts compiled ahead (issue 36, item 3): a start from the directory compiles nothing and gives the same
outputs; a directory made under other versions or hardware, or lacking a shape, is refused with what differs,
never recompiled; read-only use writes nothing into it. Real ONNX Runtime CPU sessions on real small models."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxaccel.engines import artifacts
from onnxaccel.engines.build_counts import build_counts, reset_build_counts
from onnxaccel.errors import ArtifactError, ArtifactMismatchError, ArtifactMissingError
from onnxaccel.paths import ARTIFACTS_ENV
from onnxaccel.pipeline import prepare
from onnxaccel.serve.config import model_config_from, model_defaults
from onnxaccel.serve.repository import load_instance
from onnxaccel.target import parse_target
from onnxaccel.transform.artifacts_build import compiling

CPU = parse_target("cpu")


@pytest.fixture(autouse=True)
def isolated(compile_cache, monkeypatch):
    """A cache root of its own, no artifacts directory from the environment, counts from zero."""
    monkeypatch.delenv(ARTIFACTS_ENV, raising=False)
    reset_build_counts()


def _compile_run(directory, model, target=CPU, batch=2):
    with compiling(directory):
        prepared = prepare(str(model), target, batch=batch)
        prepared.run()
        prepared.close()


def _edit_manifest(directory: Path, edit) -> None:
    path = directory / "manifest.json"
    data = json.loads(path.read_text())
    for artifact in data["artifacts"]:
        edit(artifact["key"])
    path.write_text(json.dumps(data))


def _snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(directory.rglob("*"))}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_run_start_from_the_directory_loads_and_gives_the_same_outputs(mlp_path, tmp_path, precision):
    target = parse_target(f"cpu/{precision}")
    plain = prepare(str(mlp_path), target, batch=2)
    want = plain.run()
    _compile_run(tmp_path / "art", mlp_path, target)
    reset_build_counts()
    with artifacts.use(tmp_path / "art"):
        warm = prepare(str(mlp_path), target, batch=2)  # the same seed: the same synthesized feeds
        got = warm.run()
    assert build_counts() == {"sessions": 1, "compiled": 0, "loaded": 1}
    np.testing.assert_array_equal(got["probs"], want["probs"])
    assert Path(warm.runner.model.path).is_relative_to(tmp_path / "art")  # the saved model ran, not the source
    if precision == "fp16":  # the conversion's note travels with the artifact, as a converted run shows it
        assert any("converted to FP16" in w for w in warm.warnings)


def _serve_config(source, **values):
    """The per-model config a server gives ``source`` (serve.config model_defaults, then model_config_from)."""
    defaults = model_defaults({"target": CPU, "max_batch": 4, **values})
    return model_config_from(Path(source).stem, str(source), defaults, None)


def test_a_serve_start_from_the_directory_builds_every_instance_without_compiling(mlp_path, tmp_path):
    with compiling(tmp_path / "art"):
        load_instance(_serve_config(mlp_path, instances=1)).close()
    feeds = {"x": np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)}
    cold = load_instance(_serve_config(mlp_path, instances=2))
    want = cold.pool.submit(0, cold.execute, 0, feeds).result()[0]
    cold.close()
    reset_build_counts()
    with artifacts.use(tmp_path / "art"):
        warm = load_instance(_serve_config(mlp_path, instances=2))
    assert build_counts() == {"sessions": 2, "compiled": 0, "loaded": 2}
    got = warm.pool.submit(1, warm.execute, 1, feeds).result()[0]
    warm.close()
    np.testing.assert_array_equal(got["probs"], want["probs"])


def test_another_onnxruntime_version_is_refused_naming_it(mlp_path, tmp_path):
    _compile_run(tmp_path / "art", mlp_path)
    _edit_manifest(tmp_path / "art", lambda key: key["runtime"].update(onnxruntime="1.30.0"))
    reset_build_counts()
    with artifacts.use(tmp_path / "art"), pytest.raises(ArtifactMismatchError) as caught:
        prepare(str(mlp_path), CPU, batch=2)
    import onnxruntime

    assert f"onnxruntime {onnxruntime.__version__} here, 1.30.0 in the manifest" in caught.value.message
    assert ("onnxruntime", onnxruntime.__version__, "1.30.0") in caught.value.differences
    assert "onnxaccel compile" in caught.value.hint and "without ONNXACCEL_ARTIFACTS" in caught.value.hint
    assert build_counts()["sessions"] == 0  # refused before any session, nothing compiled in its place


def test_another_gpu_is_refused_naming_both(mlp_path, tmp_path, monkeypatch):
    """The host field as a GPU machine keys it (engines/runtime_info.py host_id: "nvidia <model>"); the session
    key here is made to say H100, the manifest H200."""
    import onnxaccel.engines.cache_key as cache_key_module

    monkeypatch.setattr(cache_key_module, "host_id", lambda target: "nvidia NVIDIA H100 80GB HBM3")
    _compile_run(tmp_path / "art", mlp_path)
    _edit_manifest(tmp_path / "art", lambda key: key.update(host="nvidia NVIDIA H200"))
    with artifacts.use(tmp_path / "art"), pytest.raises(ArtifactMismatchError) as caught:
        prepare(str(mlp_path), CPU, batch=2)
    assert "GPU nvidia NVIDIA H100 80GB HBM3 here, nvidia NVIDIA H200 in the manifest" in caught.value.message


def test_a_shape_the_directory_lacks_is_refused_not_compiled(mlp_path, tmp_path):
    _compile_run(tmp_path / "art", mlp_path, batch=2)
    reset_build_counts()
    with artifacts.use(tmp_path / "art"), pytest.raises(ArtifactMissingError) as caught:
        prepare(str(mlp_path), CPU, batch=5)
    assert "x=5x4" in caught.value.message and "x=2x4" in caught.value.message
    assert build_counts() == {"sessions": 0, "compiled": 0, "loaded": 0}


def test_read_only_use_writes_nothing_into_the_directory(mlp_path, pretrained_cls, tmp_path, monkeypatch):
    art = tmp_path / "art"
    _compile_run(art, mlp_path)
    with compiling(art):  # the batch path with embedded preprocessing: an embedded copy and its session
        _batch_start(pretrained_cls)
    before = _snapshot(art)
    modes = {p: p.stat().st_mode for p in [art, *art.rglob("*")]}
    for path in modes:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        monkeypatch.setenv(ARTIFACTS_ENV, str(art))  # the way a server is started
        prepare(str(mlp_path), CPU, batch=2).run()
        _batch_start(pretrained_cls)
        assert build_counts() == {"sessions": 4, "compiled": 2, "loaded": 2}  # the two compiles above, none since
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
    assert _snapshot(art) == before  # same files, same mtimes and sizes (also where root ignores the modes)


def _batch_start(model):
    """batch's start (scale/job.py plan_job, scale/worker.py BatchWorker) with imagenet embedded."""
    from onnxaccel.prepost.presets import PreprocessRequest
    from onnxaccel.scale.datasets import Dataset
    from onnxaccel.scale.job import BatchJob, plan_job
    from onnxaccel.scale.worker import BatchWorker, WorkerSpec

    shapes = {"x": (2, 48, 192, 3)}  # the embedded model takes uint8 NHWC pixels of any size
    job = BatchJob(model=str(model), input="", output="", target=CPU, batch=2, shapes=shapes,
                   preprocess=PreprocessRequest(preset="imagenet"), embed_preprocess="imagenet")
    plan, path, _, embedded, _ = plan_job(job)
    assert embedded["preset"] == "imagenet"
    BatchWorker(WorkerSpec(path, plan, Dataset("arrays", "", ()), shapes), instances=1).close()


def test_every_model_the_directory_holds_passes_the_full_check(mlp_path, pretrained_cls, tmp_path):
    _compile_run(tmp_path / "art", mlp_path, parse_target("cpu/fp16"))
    with compiling(tmp_path / "art"):
        _batch_start(pretrained_cls)
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert {a["kind"] for a in manifest["artifacts"]} == {"variant", "ort-optimized", "embedded"}
    models = sorted((tmp_path / "art").rglob("*.onnx"))
    assert len(models) == len(manifest["artifacts"]) == 4
    for path in models:
        onnx.checker.check_model(str(path), full_check=True)


def test_compile_refuses_a_directory_made_elsewhere_and_one_that_is_not_a_store(mlp_path, tmp_path):
    _compile_run(tmp_path / "art", mlp_path)
    _edit_manifest(tmp_path / "art", lambda key: key["runtime"].update(onnxruntime="1.30.0"))
    with pytest.raises(ArtifactMismatchError):
        _compile_run(tmp_path / "art", mlp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="not empty"):
        _compile_run(other, mlp_path)
    os.environ[ARTIFACTS_ENV] = str(other)
    try:
        with pytest.raises(ArtifactError, match="no manifest.json"):
            prepare(str(mlp_path), CPU, batch=2)
    finally:
        del os.environ[ARTIFACTS_ENV]


def test_use_exports_the_directory_to_child_processes_and_restores_it(mlp_path, tmp_path):
    _compile_run(tmp_path / "art", mlp_path)
    with artifacts.use(tmp_path / "art") as store:
        assert os.environ[ARTIFACTS_ENV] == str(store.root) and artifacts.active() is store
    assert ARTIFACTS_ENV not in os.environ and artifacts.active() is None
