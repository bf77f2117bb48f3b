"""Host memory of the engines (engines/hostmem.py, engines/gpu_runtime.py): reused (page-locked where a GPU
runtime allows) buffers, page-locking memory the caller owns, direct copies, and the GPU wait mode.

Page-locking itself needs a GPU: it is measured on one (docs/BENCHMARKS.md;
benchmarks/history/serve_session_probe.py, "host memory": pinned true). Here the runtimes are missing or refuse,
and the tests check that the buffers still work, are reused, and say why they are not pinned, with the runtime's
own words.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from host_libraries import library_loads

from onnxaccel.engines.gpu_runtime import runtime_for
from onnxaccel.engines.hostmem import GPU_WAIT, DeviceCopier, HostMemory, is_pinned, pin, set_gpu_wait
from onnxaccel.engines.pool_io import join_rows


#: These tests check the refusals of a machine without a GPU driver (CI); where a driver is present the
#: refusal path cannot be reached and the calls would change the real device's settings. A HIP runtime without
#: the amdgpu driver (Debian's libamdhip64.so.5 on CI) refuses, with the reason: tests/system/test_rocm_binaries.py.
NO_NVIDIA_DRIVER = pytest.mark.skipif(library_loads("libcuda.so.1"), reason="an NVIDIA driver is present")
NO_HIP = pytest.mark.skipif(os.path.isdir("/sys/module/amdgpu") and any(
    library_loads(f"libamdhip64.so{suffix}") for suffix in ("", ".7", ".6", ".5")), reason="a HIP runtime with the amdgpu "
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


def test_zero_size_trailing_axes_get_empty_buffers():
    host = HostMemory(None)
    empty = host.buffer("x", (4, 0), np.float32)
    assert empty.shape == (4, 0) and empty.size == 0
    join_rows(empty, [np.zeros((1, 0), np.float32), np.zeros((3, 0), np.float32)])


def test_buffers_still_held_are_released_when_the_object_goes_away():
    host = HostMemory(None)
    host.buffer("x", (2, 2), np.float32)
    finalizer = host._finalizer
    assert finalizer.alive
    del host
    assert not finalizer.alive

