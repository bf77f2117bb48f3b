"""One compile-cache key for every cache: the EP caches (transform/compile_cache.py) and the native MIGraphX
engine's .mxr programs (engines/migraphx_cache.py) build the same CompileKey under one digest rule."""

from __future__ import annotations

import hashlib
import json

from onnxaccel.engines.cache_key import CompileKey, compile_cache_dir
from onnxaccel.engines.migraphx_cache import KIND, ProgramCache, program_key
from onnxaccel.model import load_model
from onnxaccel.target import parse_target
from onnxaccel.transform.compile_cache import cache_key


def _mlp(mlp_path):
    return load_model(str(mlp_path)).bind({"x": (2, 4)})


def test_ep_and_native_caches_share_one_key_type_and_digest_rule(mlp_path):
    model = _mlp(mlp_path)
    runtime = {"migraphx": "2.16.0", "rocm": "7.2.1"}
    ep = cache_key(model, parse_target("migraphx/fp16"), runtime=runtime, host="amd gfx942")
    native = program_key(model, parse_target("migraphx/fp16@migraphx"), model.input_shapes, runtime=runtime,
                         host="amd gfx942")
    assert type(ep) is type(native) is CompileKey
    for key in (ep, native):
        assert key.digest == hashlib.sha256(json.dumps(key.to_dict(), sort_keys=True).encode()).hexdigest()[:20]
        assert key.name == f"{key.kind}-{key.digest}"
    assert (ep.kind, native.kind) == ("migraphx", KIND)
    assert ep.shapes == native.shapes == {"x": [2, 4]}
    # Only the kind and the engine in the target tell them apart: the rest is keyed alike.
    assert {k for k in ep.to_dict() if ep.to_dict()[k] != native.to_dict()[k]} == {"kind", "target"}


def test_entry_folders_are_kind_dash_digest_under_the_compile_root(mlp_path, tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(tmp_path))
    model = _mlp(mlp_path)
    ep = cache_key(model, parse_target("cpu"), runtime={"onnxruntime": "1"}, host="h")
    native = program_key(model, parse_target("migraphx@migraphx"), {"x": (2, 4)}, runtime={"migraphx": "x"}, host="h")
    assert ep.entry == compile_cache_dir() / f"ort-optimized-{ep.digest}"
    assert ProgramCache().entry(native) == compile_cache_dir() / f"{KIND}-{native.digest}"


def test_calibration_is_keyed_only_when_there_is_one():
    fields = dict(kind="migraphx-native", model="m.onnx", model_sha256="0" * 64, target="migraphx@migraphx/int8",
                  precision="int8", shapes={"x": [1, 4]}, runtime={"migraphx": "2.16.0"}, host="amd gfx942")
    plain, calibrated = CompileKey(**fields), CompileKey(**fields, calibration="synthetic|8")
    assert "calibration" not in plain.to_dict() and calibrated.to_dict()["calibration"] == "synthetic|8"
    assert plain.digest != calibrated.digest


def test_a_stream_of_this_process_is_not_part_of_the_key(mlp_path):
    """serve --streams shared builds sessions with user_compute_stream=<address>, new at every start: keyed, the
    cached optimized model would never be found again."""
    model = _mlp(mlp_path)
    keys = [cache_key(model, parse_target(t), runtime={"onnxruntime": "1"}, host="h")
            for t in ("cuda:0?enable_cuda_graph=1", "cuda:0?enable_cuda_graph=1&user_compute_stream=140230",
                      "cuda:0?enable_cuda_graph=1&user_compute_stream=990011")]
    assert keys[0].digest == keys[1].digest == keys[2].digest
    assert "user_compute_stream" not in keys[1].target
    assert keys[0].digest != cache_key(model, parse_target("cuda:0"), runtime={"onnxruntime": "1"}, host="h").digest
