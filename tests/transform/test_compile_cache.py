"""Compile caches: a warm start hits and gives the same outputs; any change of a key field misses; stale
entries are listed and cleared; first-compile and warm-start times are recorded."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx

from onnxaccel.engines import compile_model
from onnxaccel.inputs import synthesize
from onnxaccel.model import load_model
from onnxaccel.target import parse_target
from onnxaccel.transform.cached_compile import compile_cached
from onnxaccel.transform.compile_cache import KEY_FILE, cache_key, list_entries
from onnxaccel.engines.runtime_info import runtime_versions

CPU = parse_target("cpu")


def _bound(path, batch=1):
    return load_model(str(path)).bind({"x": (batch, 3, 48, 192)})


def test_warm_start_hits_the_cache_and_matches_an_uncached_session(pretrained_cls, compile_cache):
    model = _bound(pretrained_cls)
    feeds = synthesize(model)
    cold_runner, cold = compile_cached(model, CPU, feeds=feeds)
    warm_runner, warm = compile_cached(model, CPU, feeds=feeds)
    assert (cold.hit, warm.hit) == (False, True) and cold.key.digest == warm.key.digest
    assert cold.key.entry.parent == compile_cache / "compile"
    plain = compile_model(model, CPU).run(feeds)
    for runner in (cold_runner, warm_runner):
        out = runner.run(feeds)
        np.testing.assert_allclose(out[next(iter(out))], plain[next(iter(plain))], atol=1e-5)
    # The warm session loads the graph saved by the cold one.
    assert warm_runner.model.path == cold.key.entry / "model.onnx"
    record = json.loads((cold.key.entry / KEY_FILE).read_text())
    assert record["hits"] == 1 and record["first_compile_seconds"] > 0 and record["warm_start_seconds"] > 0
    assert record["key"]["runtime"]["onnxruntime"] and record["key"]["shapes"] == {"x": [1, 3, 48, 192]}


def test_every_key_field_invalidates(pretrained_cls, mlp_path, tmp_path, compile_cache):
    model = _bound(pretrained_cls)
    base = cache_key(model, CPU)
    installed = runtime_versions(CPU)
    upgraded = {**installed, "onnxruntime": "99.0.0"}
    variants = {
        "runtime upgrade": cache_key(model, CPU, runtime=upgraded),
        "another host": cache_key(model, CPU, host="x86_64 Some Other CPU"),
        "shapes": cache_key(_bound(pretrained_cls, batch=4), CPU),
        "target options": cache_key(model, CPU.with_options({"intra_op_num_threads": "1"})),
        "precision": cache_key(model, parse_target("cpu/fp16")),
    }
    edited = tmp_path / "edited.onnx"
    proto = onnx.load(str(pretrained_cls))
    proto.metadata_props.add(key="edited", value="1")
    onnx.save(proto, str(edited))
    variants["model content"] = cache_key(load_model(str(edited)).bind({"x": (1, 3, 48, 192)}), CPU)
    for what, key in variants.items():
        assert key.digest != base.digest, what
    # Options that only point at caches are not part of the key.
    assert cache_key(model, CPU.with_options({"graph_optimization_level": "disable"})).digest == base.digest


def test_runtime_upgrade_misses_and_leaves_the_old_entry_stale(pretrained_cls, invoke, compile_cache):
    model = _bound(pretrained_cls)
    feeds = synthesize(model)
    old_runtime = {**runtime_versions(CPU), "onnxruntime": "1.0.0"}
    old_key = cache_key(model, CPU, runtime=old_runtime)
    compile_cached(model, CPU, feeds=feeds, key=old_key)  # as if built by onnxruntime 1.0.0
    runner, use = compile_cached(model, CPU, feeds=feeds)  # the installed runtime: a new entry, a miss
    assert not use.hit and use.key.entry != old_key.entry
    stale = {e.name: e.stale for e in list_entries()}
    assert stale == {old_key.entry.name: True, use.key.entry.name: False}

    listed = json.loads(invoke("cache", "list", "--json").stdout)
    assert {e["name"] for e in listed["entries"]} == set(stale)
    assert all({"model_sha256", "target", "precision", "shapes", "runtime", "host"} <= set(e["key"])
               for e in listed["entries"])
    table = invoke("cache", "list").output
    assert "(stale)" in table and "first" in table and "warm" in table

    cleared = json.loads(invoke("cache", "clear", "--stale", "--json").stdout)
    assert cleared["removed"] == [old_key.entry.name] and cleared["freed_bytes"] > 0
    assert [e.name for e in list_entries()] == [use.key.entry.name]
    assert invoke("cache", "clear").exit_code == 0 and list_entries() == []


def test_cache_warm_reports_first_compile_and_warm_start(invoke, mlp_path, compile_cache):
    result = invoke("cache", "warm", mlp_path, "-t", "cpu", "--shape", "batch=2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["first"]["hit"] is False and data["warm"]["hit"] is True
    assert data["first"]["seconds"] > 0 and data["warm"]["seconds"] > 0


def test_optimize_reports_first_compile_and_warm_start(invoke, mlp_path, tmp_path, compile_cache):
    result = invoke("optimize", mlp_path, "-o", tmp_path / "mlp.opt.onnx", "-t", "cpu", "--json")
    compile_info = json.loads(result.stdout)["compile"]
    assert compile_info["status"] == "measured" and compile_info["warm_hit"] is True
    assert compile_info["first_compile_seconds"] > 0 and compile_info["warm_start_seconds"] > 0


def test_provider_targets_get_their_own_cache_kind(mlp_path):
    model = load_model(str(mlp_path)).bind({"batch": (1,)})
    assert cache_key(model, parse_target("migraphx")).kind == "migraphx"
    assert cache_key(model, parse_target("tensorrt")).kind == "tensorrt"
    mx = cache_key(model, parse_target("migraphx?migraphx_model_cache_dir=/elsewhere"))
    assert mx.digest == cache_key(model, parse_target("migraphx")).digest
    assert dataclasses.asdict(mx)["target"] == "migraphx"


def test_cache_commands_explain_bad_input(invoke, tmp_path, compile_cache):
    result = invoke("cache", "clear", "--entry", "no-such-entry")
    assert result.exit_code == 2 and "No cache entry starts with" in result.output and "cache list" in result.output
    result = invoke("cache", "warm", tmp_path / "missing.onnx", "-t", "cpu")
    assert result.exit_code == 1 and "Model file not found" in result.output and "hint:" in result.output
