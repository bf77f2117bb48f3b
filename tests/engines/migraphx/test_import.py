"""Without AMD's `migraphx` module the engine says how to get it, and it tells the PyPI placeholder and
stray packages apart from the real module. (No MIGraphX is installed here; nothing needs AMD hardware.)"""

from __future__ import annotations

import sys
from importlib import metadata

import pytest

from native_helpers import PLACEHOLDER_DIR, native, use_module
from onnxaccel.engines import compile_model
from onnxaccel.engines import migraphx_setup
from onnxaccel.engines.migraphx_setup import MigraphxNotInstalledError, import_migraphx
from onnxaccel.errors import MissingDependencyError


@pytest.fixture
def no_migraphx(monkeypatch):
    monkeypatch.setitem(sys.modules, "migraphx", None)  # `import migraphx` raises ImportError
    monkeypatch.setattr(migraphx_setup, "ROCM_PYTHON_DIR", "/nonexistent/rocm/lib")


def test_missing_module_says_it_comes_from_rocm_not_pip(no_migraphx, mlp):
    with pytest.raises(MissingDependencyError) as info:
        compile_model(mlp, native())
    error = info.value
    assert isinstance(error, MigraphxNotInstalledError)
    assert "needs AMD's 'migraphx' Python module" in error.message
    assert "apt install migraphx" in error.hint and "PYTHONPATH=" in error.hint and "docs/AMD.md" in error.hint
    assert "--target migraphx" in error.hint  # the EP route that needs no native module


def test_pypi_placeholder_distribution_is_named(no_migraphx, monkeypatch):
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.0.1" if name == "migraphx" else real(name))
    with pytest.raises(MigraphxNotInstalledError) as info:
        import_migraphx()
    assert "migraphx 0.0.1 is installed: it is an empty placeholder" in info.value.hint
    assert "pip uninstall -y migraphx" in info.value.hint


def test_a_module_without_parse_onnx_is_not_taken_for_migraphx(monkeypatch):
    use_module(monkeypatch, PLACEHOLDER_DIR)
    with pytest.raises(MigraphxNotInstalledError, match="is not AMD's MIGraphX \\(it has no parse_onnx\\)"):
        import_migraphx()


def test_installed_but_not_on_sys_path_points_at_pythonpath(no_migraphx, monkeypatch, tmp_path):
    (tmp_path / "migraphx.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    monkeypatch.setattr(migraphx_setup, "ROCM_PYTHON_DIR", str(tmp_path))
    with pytest.raises(MigraphxNotInstalledError) as info:
        import_migraphx()
    assert "Python does not look in" in info.value.message
    assert info.value.hint.startswith(f"export PYTHONPATH={tmp_path}:$PYTHONPATH")


def test_a_module_whose_libraries_do_not_load_says_so(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fail(name, *args, **kwargs):
        if name == "migraphx":
            raise ImportError("libmigraphx_gpu.so.2012000: cannot open shared object file: No such file or directory")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "migraphx", raising=False)
    monkeypatch.setattr(builtins, "__import__", fail)
    with pytest.raises(MigraphxNotInstalledError, match="present but does not load") as info:
        import_migraphx()
    assert "one release" in info.value.hint and "libmigraphx_gpu" in info.value.details
