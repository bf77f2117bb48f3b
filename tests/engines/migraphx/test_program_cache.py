"""The compiled-program cache: a warm start loads the .mxr and skips parse, quantize and compile; anything
that changes the program changes the key; a damaged entry is rebuilt.

NOT EXECUTED ON AMD HARDWARE: save/load here are the stand-in's (its own file format, not msgpack). What is
proven is the engine's keying, file handling and the order of calls, not that real .mxr files load.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from native_helpers import FAKE_DIR, calls, native, use_module
from onnxaccel.engines import compile_model
from onnxaccel.engines.migraphx import MigraphxEngine
from onnxaccel.engines.migraphx_cache import KIND, ProgramCache, native_runtime_versions, program_key


def entries(tmp_path):
    root = tmp_path / "cache" / "compile"
    return sorted(root.glob(f"{KIND}-*")) if root.exists() else []


def test_warm_start_loads_the_program_instead_of_compiling(fake_mgx, mlp, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MIGRAPHX_COMPILE_S", "0.3")
    cold = compile_model(mlp, native("fp16"))
    fake_mgx._calls.clear()
    warm = compile_model(mlp, native("fp16"))
    assert calls(fake_mgx) == ["load"]
    assert (cold.cache_hit, warm.cache_hit) == (False, True)
    assert cold.compile_seconds >= 0.3 > warm.compile_seconds
    x = {"x": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}
    np.testing.assert_array_equal(cold.run(x)["probs"], warm.run(x)["probs"])
    (entry,) = entries(tmp_path)
    record = json.loads((entry / "key.json").read_text())
    assert record["schema"] == "onnxaccel.compile-cache/1" and record["hits"] == 1
    assert record["first_compile_seconds"] >= 0.3 > record["warm_start_seconds"]
    assert record["key"]["kind"] == KIND and record["key"]["shapes"] == {"x": [2, 4]}
    assert sorted(p.name for p in entry.iterdir()) == ["key.json", "program.mxr"]
    assert warm.cache_use()["hit"] is True


@pytest.mark.parametrize("change", ["precision", "shapes", "option", "migraphx", "gfx", "model"])
def test_the_key_covers_what_changes_a_program(fake_mgx, mlp, tmp_path, change):
    runtime = {"migraphx": "2.16.0", "rocm": "7.2.1"}
    base = program_key(mlp, native("fp16"), {"x": (2, 4)}, runtime=runtime, host="amd gfx942")
    model, target, shapes, host = mlp, native("fp16"), {"x": (2, 4)}, "amd gfx942"
    if change == "precision":
        target = native("fp32")
    elif change == "shapes":
        shapes = {"x": (4, 4)}
    elif change == "option":
        target = native("fp16", fast_math=0)
    elif change == "migraphx":
        runtime = {**runtime, "migraphx": "2.17.0"}
    elif change == "gfx":
        host = "amd gfx90a"
    else:
        import onnx

        proto = onnx.load(str(mlp.path))
        proto.graph.initializer[0].raw_data = bytes(len(proto.graph.initializer[0].raw_data))  # new weights
        edited = tmp_path / "edited.onnx"
        onnx.save(proto, str(edited))
        model = dataclasses.replace(mlp, path=edited)
    assert program_key(model, target, shapes, runtime=runtime, host=host).digest != base.digest


def test_cache_location_options_are_not_part_of_the_key(fake_mgx, mlp, tmp_path):
    runtime = {"migraphx": "x"}
    a = program_key(mlp, native(), {"x": (2, 4)}, runtime=runtime, host="h")
    b = program_key(mlp, native(model_cache_dir=tmp_path, cache=1), {"x": (2, 4)}, runtime=runtime, host="h")
    assert a.digest == b.digest


def test_int8_calibration_data_is_part_of_the_key(fake_mgx, cnn):
    rng = np.random.default_rng(0)
    one = [{"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}]
    two = [{"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}]
    MigraphxEngine().compile(cnn, native("int8"), calibration=one)
    again = MigraphxEngine().compile(cnn, native("int8"), calibration=one)
    other = MigraphxEngine().compile(cnn, native("int8"), calibration=two)
    assert again.cache_hit and not other.cache_hit


def test_a_damaged_cache_entry_is_discarded_and_rebuilt(fake_mgx, mlp, tmp_path):
    compile_model(mlp, native())
    (entry,) = entries(tmp_path)
    (entry / "program.mxr").write_bytes(b"truncated")
    fake_mgx._calls.clear()
    runner = compile_model(mlp, native())
    assert calls(fake_mgx)[:2] == ["load", "parse_onnx"] and not runner.cache_hit
    assert any("discarded the cached program" in w for w in runner.warnings)
    assert compile_model(mlp, native()).cache_hit  # rebuilt entry is good


def test_cache_off_writes_nothing(fake_mgx, mlp, tmp_path):
    compile_model(mlp, native(cache=0))
    compile_model(mlp, native(cache=0))
    assert entries(tmp_path) == [] and "save" not in calls(fake_mgx) and "load" not in calls(fake_mgx)


def test_model_cache_dir_option_moves_the_cache(fake_mgx, mlp, tmp_path):
    where = tmp_path / "elsewhere"
    compile_model(mlp, native(model_cache_dir=where))
    assert list(where.glob(f"{KIND}-*/program.mxr")) and entries(tmp_path) == []
    assert compile_model(mlp, native(model_cache_dir=where)).cache_hit


def test_new_shapes_go_through_the_cache_too(fake_mgx, mlp, tmp_path):
    runner = compile_model(mlp, native())
    runner.run({"x": np.ones((3, 4), np.float32)})
    assert len(entries(tmp_path)) == 2
    fake_mgx._calls.clear()
    warm = compile_model(mlp, native())
    warm.run({"x": np.ones((3, 4), np.float32)})
    assert calls(fake_mgx).count("load") == 2 and "compile" not in calls(fake_mgx)


def test_store_is_atomic_and_leaves_no_temporary_files(fake_mgx, mlp, tmp_path):
    cache = ProgramCache(tmp_path / "c")
    key = program_key(mlp, native(), {"x": (2, 4)}, runtime={"migraphx": "x"}, host="h")

    def failing_save(path):
        with open(path, "wb") as handle:
            handle.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        cache.store(key, failing_save)
    assert cache.lookup(key) is None and list((tmp_path / "c").rglob("*.tmp")) == []


def copy_of_the_stand_in(tmp_path) -> Path:
    """The stand-in package in a folder of its own, with a 'libmigraphx.so' beside it: an install to rebuild."""
    folder = tmp_path / "install"
    shutil.copytree(FAKE_DIR / "migraphx", folder / "migraphx")
    (folder / "migraphx" / "libmigraphx.so.2016000").write_bytes(b"build 1")
    return folder


def test_a_release_version_does_not_hide_the_build(fake_mgx, tmp_path):
    """__version__ is 'X.Y.Z.dev[+tweak]' for every build of a release (migraphx_py.cpp since rocm-6.3.0):
    the module and its libraries are keyed whatever the version says."""
    folder = copy_of_the_stand_in(tmp_path)
    module = str(folder / "migraphx" / "__init__.py")
    found = native_runtime_versions("2.16.0.dev", module)
    assert found["migraphx_module"] == module and found["migraphx_build"]
    (folder / "migraphx" / "libmigraphx.so.2016000").write_bytes(b"build 2, same version")
    assert native_runtime_versions("2.16.0.dev", module)["migraphx_build"] != found["migraphx_build"]


def test_a_rebuilt_migraphx_of_the_same_version_compiles_afresh(mlp, tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(tmp_path / "cache"))
    mgx = use_module(monkeypatch, copy_of_the_stand_in(tmp_path))
    assert compile_model(mlp, native()).cache_hit is False
    assert compile_model(mlp, native()).cache_hit is True
    library = Path(mgx.__file__).parent / "libmigraphx.so.2016000"
    library.write_bytes(b"build 2")  # rebuilt and reinstalled: same __version__, other code
    mgx._calls.clear()
    rebuilt = compile_model(mlp, native())
    assert rebuilt.cache_hit is False and "compile" in calls(mgx)
    assert rebuilt.describe()["migraphx_version"] == mgx.__version__
