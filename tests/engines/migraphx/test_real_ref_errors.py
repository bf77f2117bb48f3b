"""The REAL MIGraphX's own error texts, and what the native engine and its probe make of them.

The build here has no GPU target (MIGRAPHX_ENABLE_GPU=Off), which is what a machine without ROCm's migraphx
GPU library looks like: get_target("gpu") fails in dlopen. Skipped, with the reason, where the reference-
target build is absent.
"""

from __future__ import annotations

import pytest

from native_helpers import native
from onnxaccel.engines import compile_model
from onnxaccel.engines.migraphx_probe import probe
from onnxaccel.errors import PlacementError, ProviderUnavailableError

NO_GPU_LIBRARY = ("Dynamic loading or symbol lookup failed with libmigraphx_gpu.so: cannot open shared object "
                  "file: No such file or directory")


def test_get_target_gpu_fails_in_dlopen_without_the_gpu_library(real_mgx):
    with pytest.raises(RuntimeError) as info:
        real_mgx.get_target("gpu")
    assert str(info.value).endswith(NO_GPU_LIBRARY)
    assert real_mgx.get_target("ref") is not None


def test_the_engine_translates_the_missing_gpu_target_into_what_to_install(real_mgx, mlp, monkeypatch):
    monkeypatch.delenv("ONNXACCEL_MIGRAPHX_TARGET")
    with pytest.raises(ProviderUnavailableError) as info:
        compile_model(mlp, native())
    error = info.value
    assert error.message == "This MIGraphX has no 'gpu' target: libmigraphx_gpu.so is not installed with it."
    assert "apt install migraphx" in error.hint and NO_GPU_LIBRARY in error.details


def test_probe_reports_the_missing_gpu_target_and_passes_on_ref(real_mgx, monkeypatch):
    ref = probe()
    assert ref.loaded and ref.details == f"migraphx {real_mgx.__version__}, target ref"
    monkeypatch.delenv("ONNXACCEL_MIGRAPHX_TARGET")
    gpu = probe()
    assert not gpu.loaded and "no 'gpu' target" in gpu.cause and "apt install migraphx" in gpu.fix


def test_operators_migraphx_cannot_parse_are_named_before_compiling(real_mgx, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from onnxaccel.model import load_model

    known = set(real_mgx.get_onnx_operators())
    assert {"Conv", "Gemm", "Relu", "Softmax"} <= known and "StringNormalizer" not in known
    node = helper.make_node("StringNormalizer", ["s"], ["t"], case_change_action="LOWER")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
                              [helper.make_tensor_value_info("t", TensorProto.STRING, [2])])
    path = tmp_path / "strings.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(PlacementError, match="cannot parse 1 node.*StringNormalizer x1"):
        compile_model(load_model(path), native())
