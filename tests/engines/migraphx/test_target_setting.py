"""ONNXACCEL_MIGRAPHX_TARGET points the native engine at MIGraphX's reference target (tests and doctor only),
and a MIGraphX without the GPU target says so with the fix.

Against the stand-in; test_real_ref_*.py runs the same paths against the real reference-target build.
"""

from __future__ import annotations

import numpy as np
import pytest

from mgx_upstream import read_snippet
from native_helpers import calls, native, ort_reference
from onnxaccel.engines import compile_model
from onnxaccel.engines.migraphx_errors import compile_error
from onnxaccel.engines.migraphx_probe import probe
from onnxaccel.errors import ProviderUnavailableError, TargetError


def test_ref_setting_compiles_for_the_reference_target_and_keys_it(fake_mgx, mlp, monkeypatch):
    gpu = compile_model(mlp, native())
    monkeypatch.setenv("ONNXACCEL_MIGRAPHX_TARGET", "ref")
    fake_mgx._calls.clear()
    ref = compile_model(mlp, native(offload_copy=0))  # no device memory on ref: host buffers anyway
    assert dict(fake_mgx._calls)["get_target"] == {"name": "ref"} and not ref.cache_hit
    assert ref.describe()["migraphx_target"] == "ref"
    assert ref.programs()[0].key.runtime["migraphx_target"] == "ref"
    assert ref.programs()[0].key.digest != gpu.programs()[0].key.digest
    x = {"x": np.ones((2, 4), np.float32)}
    np.testing.assert_allclose(ref.run(x)["probs"], ort_reference(mlp.path, x)["probs"], rtol=1e-6)
    bound = ref.bind(x)
    bound.run()
    assert "to_gpu" not in calls(fake_mgx) and not any("offload_copy=1" in w for w in ref.warnings)


def test_an_unknown_target_setting_is_refused_before_any_work(fake_mgx, mlp, monkeypatch):
    monkeypatch.setenv("ONNXACCEL_MIGRAPHX_TARGET", "cpu")
    with pytest.raises(TargetError, match="ONNXACCEL_MIGRAPHX_TARGET='cpu'") as info:
        compile_model(mlp, native())
    assert "Unset ONNXACCEL_MIGRAPHX_TARGET" in info.value.hint and calls(fake_mgx) == []
    assert not probe().loaded


def dlopen_failure(library: str) -> RuntimeError:
    """The text make_target throws when libmigraphx_<name>.so is absent: dynamic_loader.cpp's prefix and
    dlerror()'s own words, as the reference-target build prints them (test_real_ref_errors.py checks)."""
    snippet = read_snippet("mgx_dynamic_loader.txt").text
    assert '"Dynamic loading or symbol lookup failed with "' in snippet
    return RuntimeError(f"/src/AMDMIGraphX/src/dynamic_loader.cpp:48: check_load_error: Dynamic loading or symbol "
                        f"lookup failed with {library}: cannot open shared object file: No such file or directory")


def test_a_migraphx_without_the_gpu_target_says_what_to_install():
    error = compile_error(native(), dlopen_failure("libmigraphx_gpu.so"))
    assert isinstance(error, ProviderUnavailableError)
    assert error.message == "This MIGraphX has no 'gpu' target: libmigraphx_gpu.so is not installed with it."
    assert "apt install migraphx" in error.hint and "--target migraphx" in error.hint
    assert "cannot open shared object file" in error.details


def test_migraphx_source_context_is_stripped_from_messages_of_the_binding_lambdas():
    """Recorded from the reference build (test_real_ref_fidelity.py compares live): inside migraphx_py.cpp's
    lambdas MIGRAPHX_THROW's function name is "operator()"."""
    from onnxaccel.engines.migraphx import short_message

    text = "/tmp/migraphx-ref.Z5HSvt/AMDMIGraphX/src/program.cpp:500: operator(): Parameter not found: x"
    assert short_message(text) == "Parameter not found: x"
    text = "/src/AMDMIGraphX/src/onnx/onnx_parser.cpp:283: parse_from: PARSE_FROM: Failed reading onnx file: m.onnx"
    assert short_message(text) == "PARSE_FROM: Failed reading onnx file: m.onnx"
    assert short_message("insufficient bytes") == "insufficient bytes"  # msgpack-c's own, no context
