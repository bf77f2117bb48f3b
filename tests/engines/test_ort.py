"""The ONNX Runtime engine on real sessions: both run paths, placement, provider checks, errors."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from onnxaccel import load_model
from onnxaccel.install import install_mode
from onnxaccel.engines import compile_model
from onnxaccel.engines.base import Placement, PlacedNode
from onnxaccel.engines.ort import capture_native_stderr, installed_distributions, probe_provider
from onnxaccel.engines.ort_errors import diagnose
from onnxaccel.errors import ProviderUnavailableError, TargetError
from onnxaccel.inputs import synthesize
from onnxaccel.pipeline import prepare
from onnxaccel.target import parse_target


@pytest.fixture(scope="module")
def cls_runner(pretrained_cls):
    model = load_model(pretrained_cls).bind({"x": (2, 3, 48, 192)})
    return compile_model(model, parse_target("cpu"))


def test_pretrained_model_runs_and_iobinding_matches_numpy_path(cls_runner):
    feeds = synthesize(cls_runner.model, seed=3)
    host = cls_runner.run(feeds)
    bound = cls_runner.bind(feeds)
    bound.run()
    device = bound.outputs()
    (name,) = host
    assert host[name].shape == (2, 2)
    np.testing.assert_allclose(host[name].sum(axis=1), 1.0, rtol=1e-5)  # softmax over 2 directions
    np.testing.assert_array_equal(host[name], device[name])


def test_bound_run_update_replaces_the_inputs_in_place(cls_runner):
    a, b = synthesize(cls_runner.model, seed=1), synthesize(cls_runner.model, seed=2)
    bound = cls_runner.bind(a)
    bound.run()
    first = bound.outputs()
    bound.update(b)
    bound.run()
    second = bound.outputs()
    name = next(iter(first))
    assert not np.array_equal(first[name], second[name])
    np.testing.assert_array_equal(second[name], cls_runner.run(b)[name])


def test_placement_is_read_from_the_runtime(cls_runner):
    placement = cls_runner.placement
    assert placement.method == "assignment-info"  # ORT >= 1.24 get_provider_graph_assignment_info
    assert placement.total > 0 and placement.count("CPUExecutionProvider") == placement.total
    assert placement.fallback == () and placement.summary().startswith(f"CPU took {placement.total}/")


def test_session_creation_time_is_measured(cls_runner):
    assert 0 < cls_runner.compile_seconds < 60


def test_session_options_from_the_target_reach_the_session(mlp_path):
    target = parse_target("cpu", options=["intra_op_num_threads=1", "graph_optimization_level=basic"])
    runner = compile_model(load_model(mlp_path).bind(batch=1), target)
    so = runner.session.get_session_options()
    assert so.intra_op_num_threads == 1
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC


def test_provider_missing_from_the_wheel_names_the_package_to_install(mlp_path):
    with pytest.raises(ProviderUnavailableError) as err:
        compile_model(load_model(mlp_path).bind(), parse_target("cuda"))
    assert "CUDAExecutionProvider is not part of the installed ONNX Runtime" in err.value.message
    assert f"onnxruntime {ort.__version__}" in err.value.message
    assert install_mode().install("cuda") in err.value.hint  # as onnxaccel was installed (tests/core/test_install.py)


def test_rocm_target_on_a_runtime_without_the_rocm_ep_explains_the_removal(mlp_path):
    with pytest.raises(TargetError) as err:
        compile_model(load_model(mlp_path).bind(), parse_target("rocm"))
    assert "removed from ONNX Runtime in 1.23" in err.value.message
    assert "--target migraphx" in err.value.hint and "onnxruntime-rocm <= 1.22" in err.value.hint


def test_fp16_on_cpu_runs_a_converted_model_close_to_fp32(pretrained_cls):
    fp32 = prepare(str(pretrained_cls), parse_target("cpu"), shapes={"x": (2, 3, 48, 192)})
    fp16 = prepare(str(pretrained_cls), parse_target("cpu/fp16"), shapes={"x": (2, 3, 48, 192)})
    assert any("FP16" in w for w in fp16.warnings)
    assert str(fp16.runner.target) == "cpu/fp16"
    a = next(iter(fp32.runner.run(fp32.feeds).values()))
    b = next(iter(fp16.runner.run(fp16.feeds).values()))
    assert b.dtype == np.float32  # keep_io_types
    np.testing.assert_allclose(a, b, atol=2e-2)


def test_int8_on_cpu_runs_a_dynamically_quantized_model(mlp_path):
    prepared = prepare(str(mlp_path), parse_target("cpu/int8"), batch=2)
    out = prepared.runner.run(prepared.feeds)["probs"]
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-4)


def test_int8_on_cuda_without_a_provider_switch_is_explained(mlp_path):
    with pytest.raises(TargetError, match="INT8 on cuda"):
        prepare(str(mlp_path), parse_target("cuda/int8"))


def test_probe_provider_loads_cpu_and_explains_others():
    assert probe_provider(parse_target("cpu")) is None


def test_installed_distributions_sees_the_cpu_wheel():
    assert installed_distributions().get("onnxruntime") == ort.__version__


def test_native_stderr_of_the_runtime_is_captured(mlp_path):
    so = ort.SessionOptions()
    so.log_severity_level = 0  # verbose: ORT logs node placements to stderr (rocm_facts.md §5.3)
    with capture_native_stderr() as log:
        ort.InferenceSession(str(mlp_path), so, providers=["CPUExecutionProvider"])
    assert "All nodes placed on [CPUExecutionProvider]" in log.text()


def test_captures_that_overlap_out_of_order_give_stderr_back():
    """Instances build sessions side by side, each capturing fd 2: A opens, B opens, A closes, B closes. Each
    capture dup2-ing and restoring on its own left fd 2 on A's closed capture file: the serving process's stderr
    (its warnings and logs) was lost on the H100."""
    import os
    import threading

    before = os.fstat(2)
    a_open, b_open, a_closed = threading.Event(), threading.Event(), threading.Event()
    texts = {}

    def a():
        with capture_native_stderr() as log:
            os.write(2, b"from A\n")
            a_open.set()
            b_open.wait(5)
        a_closed.set()
        texts["a"] = log.text()

    def b():
        a_open.wait(5)
        with capture_native_stderr() as log:
            b_open.set()
            a_closed.wait(5)
            os.write(2, b"from B\n")
        texts["b"] = log.text()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)  # stderr is stderr again
    assert "from A" in texts["a"] and "from B" in texts["b"]
    assert "from B" not in texts["a"]  # A's text ends where A closed


# Real messages recorded in research/rocm_facts.md (§1.4: onnxruntime-migraphx 1.27.1 and onnxruntime-rocm
# 1.22.2 without ROCm; §7: onnxruntime-gpu 1.31.1 without CUDA).
MIGRAPHX_LOAD = ("[ONNXRuntimeError] : 1 : FAIL : Failed to load library .../libonnxruntime_providers_migraphx.so "
                 "with error: libmigraphx_c.so.3: cannot open shared object file: No such file or directory")
ROCM_LOAD = ("[E:onnxruntime:Default, provider_bridge_ort.cc:2251 TryGetProviderInfo_ROCM] ... Failed to load "
             "library libonnxruntime_providers_rocm.so with error: libhipblas.so.3: cannot open shared object "
             "file: No such file or directory")
CUDA_LOAD = ("Failed to load library .../libonnxruntime_providers_cuda.so with error: libcublasLt.so.13: cannot "
             "open shared object file: No such file or directory\n[W:onnxruntime:Default, "
             "onnxruntime_pybind_state.cc:1295 CreateExecutionProviderFactoryInstance] Failed to create "
             "CUDAExecutionProvider. Require cuDNN 9.* and CUDA 13.*.")


@pytest.mark.parametrize("text,cause,fix", [
    (MIGRAPHX_LOAD, "libmigraphx_c.so.3 (MIGraphX (AMD))", "ROCm 7.x with MIGraphX"),
    (ROCM_LOAD, "libhipblas.so.3 (hipBLAS (ROCm))", "ROCm 7.x math libraries"),
    (CUDA_LOAD, "libcublasLt.so.13 (cuBLAS (CUDA))", "onnxruntime-gpu[cuda,cudnn]"),
    ("Invalid device ID: 3, must be between 0 (inclusive) and 1 (exclusive).", "device id 3 does not exist",
     "below 1"),
    ("RuntimeError: Unknown Provider Type: ROCMExecutionProvider", "does not know ROCMExecutionProvider",
     "onnxruntime package"),
])
def test_real_provider_errors_translate_to_a_fix(text, cause, fix):
    found = diagnose(text)
    assert found is not None and cause in found.cause and fix in found.fix


def test_placement_summary_names_fallback_ops_and_memcpy():
    cuda = "CUDAExecutionProvider"
    placement = Placement(cuda, {
        cuda: tuple(PlacedNode("MatMul", f"mm{i}") for i in range(9)) + (PlacedNode("MemcpyToHost", "cp"),),
        "CPUExecutionProvider": (PlacedNode("NonMaxSuppression", "nms"), PlacedNode("Range", "r")),
    }, "assignment-info")
    assert placement.summary() == ("CUDA took 9/11 nodes; 2 on CPU: NonMaxSuppression x1, Range x1; "
                                   "1 Memcpy node(s) inserted")
    assert [n.name for n in placement.fallback] == ["nms", "r"]
