"""The .mxr program cache with the REAL MIGraphX (reference target): real migraphx.save/load files, the key,
and what invalidates an entry. Skipped, with the reason, where the reference-target build is absent.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

import real_ref
from native_helpers import native
from onnxaccel.engines import compile_model
from onnxaccel.engines import migraphx as engine_module
from onnxaccel.engines.migraphx_cache import KIND, native_runtime_versions


def entries(tmp_path):
    return sorted((tmp_path / "cache" / "compile").glob(f"{KIND}-*"))


def test_a_warm_start_loads_the_saved_program(real_mgx, mlp, tmp_path):
    cold = compile_model(mlp, native("fp16"))
    (entry,) = entries(tmp_path)
    program = entry / "program.mxr"
    assert program.stat().st_size > 0
    # migraphx.save writes msgpack by default: the real module reads it back as a program, the json reader not
    assert real_mgx.load(str(program), format="msgpack").is_compiled()
    warm = compile_model(mlp, native("fp16"))
    assert (cold.cache_hit, warm.cache_hit) == (False, True)
    assert warm.programs()[0].parse_seconds == 0 and warm.programs()[0].load_seconds > 0
    x = {"x": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}
    np.testing.assert_array_equal(cold.run(x)["probs"], warm.run(x)["probs"])
    key = json.loads((entry / "key.json").read_text())["key"]
    assert key["runtime"]["migraphx_target"] == "ref" and key["runtime"]["migraphx"] == real_mgx.__version__
    assert key["runtime"]["migraphx_module"] == str(Path(real_mgx.__file__).resolve())
    assert re.fullmatch(r"[0-9a-f]{20}", key["runtime"]["migraphx_build"])


def test_precision_and_shapes_get_entries_of_their_own(real_mgx, mlp, tmp_path):
    compile_model(mlp, native("fp16"))
    fp32 = compile_model(mlp, native())
    fp32.run({"x": np.ones((3, 4), np.float32)})
    assert not fp32.cache_hit and len(entries(tmp_path)) == 3


def test_a_damaged_entry_is_discarded_with_migraphx_reason_and_rebuilt(real_mgx, mlp, tmp_path):
    compile_model(mlp, native())
    (entry,) = entries(tmp_path)
    (entry / "program.mxr").write_bytes(b"\x92\x01")  # msgpack, but not a program
    runner = compile_model(mlp, native())
    (note,) = [w for w in runner.warnings if "discarded the cached program" in w]
    assert not runner.cache_hit and "recompiling" in note
    assert compile_model(mlp, native()).cache_hit


def test_the_build_identity_does_not_change_when_targets_load(real_mgx, mlp):
    """get_target("ref") dlopens libmigraphx_ref.so during the first compile; the key before and after is one."""
    before = native_runtime_versions(real_mgx.__version__, real_mgx.__file__, "ref")
    compile_model(mlp, native(cache=0))
    assert native_runtime_versions(real_mgx.__version__, real_mgx.__file__, "ref") == before


def test_a_rebuilt_migraphx_of_the_same_version_does_not_reuse_programs(real_mgx, mlp, tmp_path, monkeypatch):
    """The same __version__ ("2.16.0.dev") from other files: a copy of the module beside links to the build's
    libraries stands for a reinstall; touching it stands for a rebuild."""
    module = Path(real_mgx.__file__)
    assert compile_model(mlp, native()).cache_hit is False
    assert compile_model(mlp, native()).cache_hit is True
    copy = real_ref.private_copy(module, tmp_path / "reinstalled")
    monkeypatch.setattr(engine_module, "module_origin", lambda mgx: str(copy))
    assert compile_model(mlp, native()).cache_hit is False  # another install
    assert compile_model(mlp, native()).cache_hit is True
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    rebuilt = compile_model(mlp, native())
    assert rebuilt.cache_hit is False  # rebuilt in place: same path, same version, new files
    assert rebuilt.describe()["migraphx_version"] == real_mgx.__version__
