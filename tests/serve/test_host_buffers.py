"""The served model's host side: reused (page-locked where a GPU runtime allows) join buffers, the row join
that keeps the GIL, the GPU wait mode, and uvicorn's body high-water mark.

Page-locking itself needs a GPU: it is measured on the H200 (benchmarks/serve_session_probe.py, "host memory":
pinned true). Here the runtimes are missing or refuse, and the tests check that the buffers still work, are
reused, and say why they are not pinned, with the runtime's own words.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from onnxaccel.engines.hostmem import (GPU_WAIT, DeviceCopier, HostMemory, is_pinned, pin, runtime_for,
                                       set_gpu_wait)
from onnxaccel.serve.instance import _join_rows


def _loads(name: str) -> bool:
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


#: These tests check the refusals of a machine without a GPU driver (CI); where a driver is present the
#: refusal path cannot be reached and the calls would change the real device's settings. A HIP runtime without
#: the amdgpu driver (Debian's libamdhip64.so.5 on CI) refuses, with the reason: tests/system/test_rocm_binaries.py.
NO_NVIDIA_DRIVER = pytest.mark.skipif(_loads("libcuda.so.1"), reason="an NVIDIA driver is present")
NO_HIP = pytest.mark.skipif(os.path.isdir("/sys/module/amdgpu") and any(
    _loads(f"libamdhip64.so{suffix}") for suffix in ("", ".7", ".6", ".5")), reason="a HIP runtime with the amdgpu "
    "driver is present")


def test_cpu_buffers_are_reused_page_aligned_and_not_pinned():
    host = HostMemory(None)
    a = host.buffer("x", (8, 3, 5), np.float32)
    assert a.shape == (8, 3, 5) and a.dtype == np.float32
    assert a.ctypes.data % 4096 == 0
    a[...] = 7
    b = host.buffer("x", (4, 3, 5), np.float32)  # fewer rows: the first rows of the same memory
    assert b.ctypes.data == a.ctypes.data and b.shape == (4, 3, 5)
    assert np.all(b == 7)
    c = host.buffer("x", (16, 3, 5), np.float32)  # more rows: a new, larger buffer
    assert c.shape == (16, 3, 5)
    assert host.buffer("x", (8, 3, 5), np.float32).ctypes.data == c.ctypes.data
    assert host.buffer("x", (8, 3, 5), np.float16).ctypes.data != c.ctypes.data  # dtype is part of the key
    described = host.describe()
    assert described["pinned"] is False and described["pinned_bytes"] == 0
    assert described["reason"] == "no GPU runtime (CPU target)"
    host.close()
    assert host.describe()["buffers"] == 0


def test_buffers_beyond_keep_release_the_least_recently_used():
    host = HostMemory(None, keep=2)
    first = host.buffer("a", (2, 4), np.float32)
    host.buffer("b", (2, 4), np.float32)
    assert host.buffer("a", (2, 4), np.float32).ctypes.data == first.ctypes.data  # "a" is now the most recent
    host.buffer("c", (2, 4), np.float32)  # evicts "b"
    assert host.describe()["buffers"] == 2
    assert host.buffer("a", (2, 4), np.float32).ctypes.data == first.ctypes.data


@NO_NVIDIA_DRIVER
@NO_HIP
@pytest.mark.parametrize("runtime", ["cuda", "hip"])
def test_without_a_usable_gpu_runtime_buffers_work_and_say_why_they_are_not_pinned(runtime):
    host = HostMemory(runtime)
    buffer = host.buffer("x", (3, 4), np.float32)
    buffer[...] = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert buffer.sum() == 66
    described = host.describe()
    assert described["pinned"] is False
    # The runtime library is absent, or present without a GPU driver: a CUDA runtime from a wheel answers
    # cudaHostRegister with its own error text, Debian's HIP runtime with hipErrorInvalidDevice and the reason.
    assert ("libamdhip64" in described["reason"]) if runtime == "hip" else (
        "libcudart" in described["reason"] or "cudaHostRegister failed: error" in described["reason"])


@NO_NVIDIA_DRIVER
@NO_HIP
@pytest.mark.parametrize("runtime", ["cuda", "hip"])
def test_pinning_shared_memory_without_a_gpu_runtime_says_why_and_nothing_counts_as_pinned(runtime):
    """The model process of --shared-models page-locks each worker's arena (pin) and copies requests from it
    straight to the GPU (DeviceCopier) only where is_pinned says so; here every step refuses with the reason."""
    import mmap

    arena = mmap.mmap(-1, 1 << 20)
    flat = np.frombuffer(arena, dtype=np.uint8)
    try:
        assert pin(None, flat.ctypes.data, flat.nbytes) == "no GPU runtime (CPU target)"
        reason = pin(runtime, flat.ctypes.data, flat.nbytes)
        assert ("libamdhip64" in reason) if runtime == "hip" else (
            "libcudart" in reason or "cudaHostRegister failed: error" in reason)
        assert not is_pinned(flat.ctypes.data, 4096)
        with pytest.raises(RuntimeError, match="libamdhip64" if runtime == "hip" else "libcudart|error"):
            DeviceCopier(runtime).copy([(0, [(flat.ctypes.data, 16)])])
    finally:
        del flat
        arena.close()


def test_runtime_for_maps_devices_to_their_runtime():
    assert [runtime_for(d) for d in ("cpu", "cuda", "tensorrt", "rocm", "migraphx")] == [
        None, "cuda", "cuda", "hip", "hip"]


@NO_NVIDIA_DRIVER
@NO_HIP
def test_gpu_wait_modes_and_refusals_here():
    assert set(GPU_WAIT) == {"auto", "spin", "yield", "block"}
    assert "unknown GPU wait mode 'nap'" in set_gpu_wait("cuda", 0, "nap")
    assert set_gpu_wait(None, 0, "block") == "not a GPU target"
    # No NVIDIA driver on this machine: the driver library itself is missing.
    assert "libcuda.so.1" in set_gpu_wait("cuda", 0, "block")
    assert "libamdhip64" in set_gpu_wait("hip", 0, "block")


def reference_join(values, size):
    joined = np.concatenate(values, axis=0)
    pad = size - joined.shape[0]
    return np.concatenate([joined, np.repeat(joined[-1:], pad, axis=0)]) if pad else joined


@pytest.mark.parametrize("size", [6, 8])
def test_join_rows_copies_parts_in_order_and_pads_with_the_last_row(size):
    rng = np.random.default_rng(3)
    values = [rng.random((n, 3, 4), dtype=np.float32) for n in (1, 2, 3)]
    buffer = np.full((size, 3, 4), -1.0, dtype=np.float32)
    _join_rows(buffer, values)
    assert np.array_equal(buffer, reference_join(values, size))


def test_join_rows_refuses_more_rows_than_the_buffer_holds():
    buffer = np.zeros((3, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="more than the buffer's 3 rows"):
        _join_rows(buffer, [np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)])


def test_zero_size_trailing_axes_get_empty_buffers():
    host = HostMemory(None)
    empty = host.buffer("x", (4, 0), np.float32)
    assert empty.shape == (4, 0) and empty.size == 0
    _join_rows(empty, [np.zeros((1, 0), np.float32), np.zeros((3, 0), np.float32)])


def test_buffers_still_held_are_released_when_the_object_goes_away():
    host = HostMemory(None)
    host.buffer("x", (2, 2), np.float32)
    finalizer = host._finalizer
    assert finalizer.alive
    del host
    assert not finalizer.alive


def test_join_rows_handles_strided_and_other_dtype_parts():
    rng = np.random.default_rng(4)
    base = rng.random((4, 6), dtype=np.float32)
    strided = base[:, ::2]  # not C-contiguous: copied by numpy, not memmove
    other = rng.random((1, 3)).astype(np.float64)  # cast on assignment
    buffer = np.zeros((5, 3), dtype=np.float32)
    _join_rows(buffer, [strided, other])
    assert np.array_equal(buffer[:4], strided)
    assert np.array_equal(buffer[4], other[0].astype(np.float32))


def test_body_high_water_is_raised_for_httptools():
    httptools_impl = pytest.importorskip("uvicorn.protocols.http.httptools_impl")
    from onnxaccel.serve.server import BODY_HIGH_WATER, _raise_body_high_water

    before = httptools_impl.HIGH_WATER_LIMIT
    try:
        _raise_body_high_water(64 * 2**20)
        assert httptools_impl.HIGH_WATER_LIMIT == max(before, BODY_HIGH_WATER)
        _raise_body_high_water(1024)  # never lowered below what is set
        assert httptools_impl.HIGH_WATER_LIMIT == max(before, BODY_HIGH_WATER)
    finally:
        httptools_impl.HIGH_WATER_LIMIT = before


@pytest.mark.parametrize("target,key", [("cuda:0?enable_cuda_graph=1&prefer_nhwc=1", "enable_cuda_graph"),
                                        ("rocm?enable_hip_graph=1", "enable_hip_graph"),
                                        ("tensorrt?trt_cuda_graph_enable=True", "trt_cuda_graph_enable")])
def test_graph_capture_from_a_tuned_target_is_dropped_when_serving_with_a_note(target, key):
    from onnxaccel.serve.config import ModelConfig
    from onnxaccel.target import parse_target

    assert parse_target(target).graph_capture
    resolved, notes = ModelConfig(name="m", source="zoo:resnet50", target=target, precision="fp16").resolved_target()
    assert key not in resolved.option_dict and not resolved.graph_capture
    assert resolved.precision == "fp16"
    if "prefer_nhwc" in target:
        assert resolved.option_dict["prefer_nhwc"] == "1"  # the other tuned options stay
    assert any(key in n and "served without it" in n for n in notes)
    plain, plain_notes = ModelConfig(name="m", source="zoo:resnet50", target="cuda:0?prefer_nhwc=1").resolved_target()
    assert not any("graph capture" in n for n in plain_notes)


def test_graph_capture_is_kept_for_models_served_in_padded_sizes():
    from onnxaccel.serve.config import ModelConfig

    config = ModelConfig(name="m", source="zoo:resnet50", target="cuda:0?enable_cuda_graph=1", precision="fp16")
    resolved, notes = config.resolved_target(graph_ok=True)
    assert resolved.graph_capture and not any("graph capture" in n for n in notes)


def test_bound_sessions_per_size_answer_like_a_plain_session(mlp_path):
    """The graph-capture run path (inputs and outputs bound once per instance and size, new values copied in
    before each run) on ONNX Runtime's CPU provider, which binds the same way but captures nothing."""
    import onnxruntime as ort

    from onnxaccel.model import load_model
    from onnxaccel.serve.config import ModelConfig
    from onnxaccel.serve.repository import _compile, load_instance
    from onnxaccel.target import parse_target

    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=8))
    try:
        model, target = load_model(str(mlp_path)), parse_target("cpu")
        instance.buckets = (1, 2, 4, 8)
        instance.size_runners = [{size: _compile(model, target, {})[1] for size in instance.buckets}]
        instance.graph = True
        assert instance.warm_up() == [1, 2, 4, 8]
        assert sorted(instance.bound) == [(0, 1), (0, 2), (0, 4), (0, 8)]
        sess = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(11)
        for rows in ((1, 2), (3,), (2, 2, 1), (8,)):  # padded to 4, 4, 8, 8: each size's binding is reused
            parts = [{"x": rng.random((n, 4), dtype=np.float32)} for n in rows]
            outputs, _seconds = instance.execute_joined(0, parts)
            want = sess.run(None, {"x": np.concatenate([p["x"] for p in parts])})[0]
            assert outputs["probs"].shape == want.shape
            np.testing.assert_array_equal(outputs["probs"], want)  # new inputs every time: no stale values
    finally:
        instance.close()
    assert not instance.bound


def test_graph_capture_needs_every_axis_but_the_batch_fixed(tmp_path, mlp_path):
    import onnx
    from onnx import TensorProto, helper

    from onnxaccel.model import load_model
    from onnxaccel.serve.instance import graph_capture_possible

    assert graph_capture_possible(load_model(str(mlp_path)))
    graph = helper.make_graph([helper.make_node("Identity", ["tokens"], ["same"])], "seq",
                              [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["N", "L"])],
                              [helper.make_tensor_value_info("same", TensorProto.FLOAT, ["N", "L"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "seq.onnx"))
    assert not graph_capture_possible(load_model(str(tmp_path / "seq.onnx")))


def test_a_capture_waits_for_running_batches_and_holds_new_ones_back():
    import threading
    import time

    from onnxaccel.serve.instance import CaptureGate

    gate, events = CaptureGate(), []
    batch_running, release_batch = threading.Event(), threading.Event()

    def batch(name, hold=None):
        with gate.shared():
            events.append(f"{name} start")
            if hold is not None:
                batch_running.set()
                hold.wait(5)
            events.append(f"{name} end")

    def capture():
        with gate.exclusive():
            events.append("capture start")
            time.sleep(0.1)
            events.append("capture end")

    first = threading.Thread(target=batch, args=("a", release_batch))
    first.start()
    batch_running.wait(5)
    capturing = threading.Thread(target=capture)
    capturing.start()
    time.sleep(0.1)
    later = threading.Thread(target=batch, args=("b",))  # arrives while the capture waits: goes after it
    later.start()
    time.sleep(0.1)
    assert events == ["a start"]
    release_batch.set()
    for thread in (first, capturing, later):
        thread.join(5)
    assert events == ["a start", "a end", "capture start", "capture end", "b start", "b end"]


class HostCopier:
    """Stand-in for DeviceCopier where no GPU exists: the same ``copy(jobs)``/``close()`` API, with host memory as
    the "device" and the runtime's error text when told to fail at a given piece."""

    def __init__(self, fail_at: int | None = None):
        self.fail_at, self.pieces = fail_at, 0

    def copy(self, jobs):
        for destination, pieces in jobs:
            at = destination
            for address, nbytes in pieces:
                self.pieces += 1
                if self.pieces == self.fail_at:
                    raise RuntimeError("cudaMemcpyAsync failed: error 1")
                ctypes.memmove(at, address, nbytes)
                at += nbytes

    def close(self):
        pass


class HostAddressed:
    """A CPU IO binding that tells its input addresses, as a GPU binding does (input_addresses)."""

    def __init__(self, bound):
        self.bound = bound

    def input_addresses(self):
        return {name: value.data_ptr() for name, value in self.bound.values.items()}

    def __getattr__(self, name):
        return getattr(self.bound, name)


def test_direct_copies_place_each_request_in_its_rows_and_fall_back_to_the_host_join(mlp_path, monkeypatch):
    """The --shared-models graph path copies each request from page-locked memory into its rows of the bound
    input (ModelInstance._execute_direct). Here the "device" is host memory (a CPU binding and the HostCopier
    stand-in; page-locking is assumed): every batch shape gives exactly the unbatched rows, no host join
    happens, and a copy that fails part-way falls back to the host join with the reason kept."""
    import onnxruntime as ort

    import onnxaccel.serve.instance as instance_module
    from onnxaccel.model import load_model
    from onnxaccel.serve.config import ModelConfig
    from onnxaccel.serve.repository import _compile, load_instance
    from onnxaccel.target import parse_target

    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=8))
    try:
        model, target = load_model(str(mlp_path)), parse_target("cpu")
        instance.buckets = (1, 2, 4, 8)
        instance.size_runners = [{s: _compile(model, target, {})[1] for s in instance.buckets}]
        instance.graph = True  # bound sessions per size, as with graph capture
        instance.warm_up()
        instance.bound = {k: HostAddressed(v) for k, v in instance.bound.items()}
        instance.copiers = [HostCopier()]
        monkeypatch.setattr(instance_module, "is_pinned", lambda address, nbytes: True)
        session = ort.InferenceSession(str(mlp_path), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(3)
        for rows in ((1, 2), (3,), (2, 2, 1), (8,), (1,), (5, 3), (1, 1, 1)):
            parts = [{"x": rng.random((n, 4), dtype=np.float32)} for n in rows]
            out, _ = instance.execute_joined(0, parts)
            want = session.run(None, {"x": np.concatenate([p["x"] for p in parts])})[0]
            np.testing.assert_array_equal(out["probs"], want)
            assert "copy_in" in instance.phases[0] and "join" not in instance.phases[0]
        instance.copiers = [HostCopier(fail_at=2)]
        parts = [{"x": rng.random((n, 4), dtype=np.float32)} for n in (2, 1)]
        out, _ = instance.execute_joined(0, parts)
        np.testing.assert_array_equal(out["probs"], session.run(None, {"x": np.concatenate([p["x"] for p in parts])})[0])
        assert instance.copiers[0] is None and "cudaMemcpyAsync failed" in instance.direct_copy_note
        assert "join" in instance.phases[0]
    finally:
        instance.close()
