"""The compile cache compiles without the cache only where ONNX Runtime's optimized graph itself cannot be
saved or reloaded; an I/O error or a failure to load a graph that loaded before is raised, never remembered as
"uncacheable" (transform/cached_compile.py). And a start from an artifacts directory converts nothing to label
the precision that executed (pipeline.executed_plan).

Model: the tests' small MLP with real weights (tests/model_builders.py); the uncacheable graphs themselves are
ONNX's own LinearAttention cases (test_written_models.py)."""

from __future__ import annotations

import pytest

from onnxaccel.errors import InferenceError, ModelError
from onnxaccel.model import load_model
from onnxaccel.target import parse_target
from onnxaccel.transform import cached_compile

pytest.importorskip("onnxruntime")


def test_an_unwritable_cache_is_an_error_not_an_uncacheable_entry(mlp_path, compile_cache, monkeypatch):
    def disk_full(*_args, **_kwargs):
        raise ModelError("Cannot write /cache/model.onnx: [Errno 28] No space left on device", "Free space.")

    monkeypatch.setattr(cached_compile, "save_optimized", disk_full)
    model = load_model(str(mlp_path)).bind(batch=2)
    with pytest.raises(ModelError, match="No space left"):
        cached_compile.compile_cached(model, parse_target("cpu"))
    assert not list(compile_cache.rglob(cached_compile.UNCACHEABLE_FILE))
    monkeypatch.undo()
    runner, use = cached_compile.compile_cached(model, parse_target("cpu"))  # the disk is fine again: cached
    runner.close()
    assert use.uncached is None and (use.key.entry / cached_compile.OPTIMIZED_FILE).is_file()


def test_a_cached_graph_that_fails_to_load_later_is_kept_and_the_error_raised(mlp_path, compile_cache, monkeypatch):
    model = load_model(str(mlp_path)).bind(batch=2)
    runner, first = cached_compile.compile_cached(model, parse_target("cpu"))
    runner.close()
    saved = first.key.entry / cached_compile.OPTIMIZED_FILE
    assert saved.is_file()

    def out_of_memory(*_args, **_kwargs):
        raise InferenceError("ONNX Runtime could not build a session: bad allocation")

    monkeypatch.setattr(cached_compile, "compile_model", out_of_memory)
    with pytest.raises(InferenceError, match="bad allocation"):
        cached_compile.compile_cached(model, parse_target("cpu"))
    assert saved.is_file() and not (first.key.entry / cached_compile.UNCACHEABLE_FILE).exists()


def test_a_start_from_artifacts_converts_nothing_for_the_precision_label(mlp_path, tmp_path, monkeypatch):
    from onnxaccel import pipeline
    from onnxaccel.engines import artifacts
    from onnxaccel.plan import PlanRequest, plan_execution

    target = parse_target("cpu/fp16")
    model = load_model(str(mlp_path))
    plan = plan_execution(target, PlanRequest(command="serve"), model=model)
    converted = []

    def variant():
        converted.append(True)
        raise AssertionError("converted although the artifacts directory holds the converted model")

    with monkeypatch.context() as patch:
        patch.setattr(artifacts, "active", lambda: object())  # ONNXACCEL_ARTIFACTS=DIR, as serve/batch see it
        assert pipeline.executed_plan(plan, variant) is plan
    assert not converted
    assert pipeline.executed_plan(plan, variant) is plan  # a conversion that fails leaves the label as asked
    assert converted
