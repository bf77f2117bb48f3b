"""Reusable, page-locked (pinned) host buffers for the copies to and from a GPU.

A host-to-device copy from ordinary (pageable) memory goes through the driver's own staging buffer in chunks;
from page-locked memory it is one DMA transfer, several times faster for the megabytes of an image batch.
A buffer that is reused also costs no page faults: joining a batch into a freshly allocated array while another
thread allocates is many times slower than joining it into a reused one (benchmarks/history/serve_session_probe.py
measures both; figures in the history of docs/BENCHMARKS.md).

ONNX Runtime's Python API has no allocator for pinned user buffers, so a buffer here is a numpy array that
is registered with the GPU runtime: ``cudaHostRegister`` (CUDA runtime API) or ``hipHostRegister`` (HIP),
with the *portable* flag (pinned for every context). The runtime's copies then see pinned memory wherever
the array is passed, ``InferenceSession.run`` included. Where the runtime library is missing or refuses
(a CPU machine, a sandbox without host registration), buffers stay ordinary but are still reused;
``HostMemory.pinned`` and ``HostMemory.reason`` say which.

``set_gpu_wait`` chooses how a host thread waits for the GPU (spin, yield or block), for the whole process.

Not run on AMD hardware: the HIP paths are written to the HIP runtime API (hip_runtime_api.h) with the same
calls and flag values as CUDA's. What did run here is the HIP runtime without a GPU: Debian's libamdhip64-5
(``libamdhip64.so.5``, HIP 5.2.21153) answers hipGetDeviceCount with 100 (hipErrorNoDevice) and hipSetDevice,
hipHostRegister, hipSetDeviceFlags and hipStreamCreateWithFlags with 101 (hipErrorInvalidDevice). A refusal
like that is reported with the reason found on the machine (the amdgpu driver, /dev/kfd) and its fix.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections import OrderedDict

import numpy as np

from onnxaccel.engines.gpu_runtime import clear_error, load_runtime, refusal, register, set_device, unregister

_PAGE = 4096
_lock = threading.Lock()


class HostMemory:
    """Host buffers for one model's transfers, page-locked through ``runtime`` where possible.

    ``buffer(key, shape, dtype)`` returns the same array for the same key, shape and dtype (a view of the
    first rows when fewer are asked than it holds), so a caller that uses one key at a time per thread
    reuses its memory. At most ``keep`` buffers are held; the least recently used one is released first.
    """

    def __init__(self, runtime: str | None, *, keep: int = 16, device_id: int = 0):
        self.runtime = runtime
        self.keep = keep
        self.device_id = device_id
        self.pinned = False
        self.reason = "no GPU runtime (CPU target)" if runtime is None else ""
        self.pinned_bytes = 0
        self._buffers: OrderedDict[tuple, tuple[np.ndarray, np.ndarray, bool]] = OrderedDict()
        self._lib = None
        self._refused = False
        if runtime is not None:
            self._lib, self.reason = load_runtime(runtime)
        # Registered memory must be unregistered before it is freed, also when close() is never called.
        self._finalizer = weakref.finalize(self, HostMemory._release_all, self._buffers, self._lib, runtime)

    def buffer(self, key, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An array of ``shape`` and ``dtype`` for ``key``, reused across calls (contents are not cleared)."""
        dtype = np.dtype(dtype)
        rows, trailing = (shape[0], tuple(shape[1:])) if shape else (1, ())
        slot = (key, trailing, dtype.str)
        held = self._buffers.get(slot)
        if held is not None and held[0].shape[0] >= rows:
            self._buffers.move_to_end(slot)
            return held[0][:rows] if shape else held[0].reshape(())
        if held is not None:
            self._release(self._buffers.pop(slot))
        array, base, pinned = self._allocate((rows, *trailing), dtype)
        self._buffers[slot] = (array, base, pinned)
        while len(self._buffers) > self.keep:
            self._release(self._buffers.popitem(last=False)[1])
        return array if shape else array.reshape(())

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, bool]:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        # Page-aligned, whole pages: registration pins pages, and a buffer must not share one with another.
        size = max(1, -(-nbytes // _PAGE)) * _PAGE
        base = np.empty(size + _PAGE, dtype=np.uint8)
        offset = (-base.ctypes.data) % _PAGE
        raw = base[offset:offset + size]
        array = raw[:nbytes].view(dtype).reshape(shape)
        pinned = False
        if self._lib is not None and not self._refused and dtype != np.dtype(object):
            refused = register(self._lib, self.runtime, raw.ctypes.data, size, self.device_id)
            if not refused:
                pinned = True
                self.pinned = True
                self.pinned_bytes += size
            else:  # not retried for later buffers: the reason stays as the runtime gave it
                self.reason = refused
                self._refused = True
        return array, raw, pinned

    def _release(self, held: tuple[np.ndarray, np.ndarray, bool]) -> None:
        _, raw, pinned = held
        if pinned and self._lib is not None:
            unregister(self._lib, self.runtime, raw.ctypes.data)
            self.pinned_bytes -= raw.nbytes

    def close(self) -> None:
        """Unregister and drop every buffer (call once nothing runs on them any more)."""
        while self._buffers:
            self._release(self._buffers.popitem()[1])

    @staticmethod
    def _release_all(buffers: OrderedDict, lib, runtime) -> None:
        """The finalizer: unregister what is still held when the object goes away without close()."""
        for _, raw, pinned in buffers.values():
            if pinned and lib is not None:
                unregister(lib, runtime, raw.ctypes.data)
        buffers.clear()

    def describe(self) -> dict:
        """Runtime, whether pinned (and how many bytes), buffers held, and why not pinned where not."""
        return {"runtime": self.runtime, "pinned": self.pinned, "pinned_bytes": self.pinned_bytes,
                "buffers": len(self._buffers), "reason": self.reason}


#: How a host thread waits for the GPU: CUDA driver API CU_CTX_SCHED_* (cuda.h) and HIP's hipDeviceSchedule*
#: (include/hip/hip_runtime_api.h, ROCm/HIP@50ec90c65cc383f676c099ecb0546e183851f6b1, rocm-6.2.0) share the values.
GPU_WAIT = {"auto": 0x00, "spin": 0x01, "yield": 0x02, "block": 0x04}

#: What each mode does, per runtime. CUDA: the driver's scheduling flags; ``block`` checked on an NVIDIA GPU
#: (the primary context's flags read 0x4 and the server's CPU per request fell, docs/BENCHMARKS.md).
#: ROCm, from the HIP runtime's source, never run on AMD hardware here. hipSetDeviceFlags
#: (hipamd/src/hip_device_runtime.cpp, ROCm/clr@dd7f9576620569fc8847cef767efcc1f4bab9d1a, rocm-6.2.0; the same
#: switch in ROCm/hipamd@02187ecfc8a1a6ed2bbca29000a83dec5a61cb7f, rocm-5.2.3, and in
#: ROCm/rocm-systems@bfa0257224c0b3eb650fbe17c477d8d160e5464c, projects/clr) sends spin and yield to one case,
#: "The both options falls into yield" (an active wait), and gives blocking sync an inactive one. The inactive
#: wait (WaitForSignal, rocclr/device/rocm/rocvirtual.hpp, same ROCm/clr commit) polls the completion signal for
#: kTimeout100us and then waits with HSA_WAIT_STATE_BLOCKED ("Wait until the completion with CPU suspend"). HIP's
#: API reference (hip_runtime_api.h above) says instead "hipDeviceScheduleBlockingSync : On ROCm platform, this
#: is a synonym for hipDeviceScheduleYield"; the code is what runs. The runtime starts every device with an
#: active wait (hipamd/src/hip_context.cpp, SetActiveWait(true)). Vendored in tests/system/upstream/hip_*.txt.
GPU_WAIT_EFFECT = {
    "cuda": {"auto": "spin while the process has fewer active contexts than cores, else yield",
             "spin": "spin", "yield": "yield the core while waiting",
             "block": "sleep until the GPU signals (blocking sync)"},
    "hip": {"auto": "active wait (the runtime's default), or the blocking wait when HIP has at least as many "
                    "devices as there are cores",
            "spin": "active wait (the same as yield)", "yield": "active wait (the same as spin)",
            "block": "poll for up to 100 us, then sleep until the GPU signals"},
}


def set_gpu_wait(runtime: str | None, device_id: int, mode: str) -> str:
    """Make threads of this process that wait for GPU ``device_id`` spin, yield or block. What each does per
    runtime is in ``GPU_WAIT_EFFECT`` (on ROCm ``block`` first polls up to 100 us). Returns '' when set, else
    why not.

    By default (``auto``) CUDA spins while the process has fewer active contexts than cores: a served model's
    run thread then keeps a core busy for the whole run, and a server with several worker processes spends
    the cores its event loops need on spinning. ``block`` costs tens of microseconds of wake-up per run.

    CUDA: the driver API's ``cuDevicePrimaryCtxSetFlags`` on the device's primary context (the one ONNX
    Runtime's CUDA EP uses), before the context is first used: call it before loading models. HIP:
    ``hipSetDevice`` then ``hipSetDeviceFlags``.
    """
    if mode not in GPU_WAIT:
        return f"unknown GPU wait mode '{mode}' (choose from {', '.join(GPU_WAIT)})"
    if runtime is None:
        return "not a GPU target"
    flags = GPU_WAIT[mode]
    try:
        if runtime == "cuda":
            lib = ctypes.CDLL("libcuda.so.1")
            status = lib.cuInit(0)
            device = ctypes.c_int()
            if status == 0:
                status = lib.cuDeviceGet(ctypes.byref(device), int(device_id))
            if status == 0:
                setter = getattr(lib, "cuDevicePrimaryCtxSetFlags_v2", None) or lib.cuDevicePrimaryCtxSetFlags
                status = setter(device, ctypes.c_uint(flags))
            return "" if status == 0 else f"the CUDA driver refused (CUresult {status})"
        lib, reason = load_runtime("hip")
        if lib is None:
            return reason
        for call, argument in (("hipSetDevice", int(device_id)), ("hipSetDeviceFlags", ctypes.c_uint(flags))):
            status = getattr(lib, call)(argument)
            if status != 0:
                return "the HIP runtime refused: " + refusal(lib, "hip", call, status, device_id)
        return ""
    except (OSError, AttributeError) as exc:
        return f"no {'CUDA driver (libcuda.so.1)' if runtime == 'cuda' else 'HIP runtime'}: {exc}"


# --- memory the caller owns, page-locked in place; copies straight from it -----------------------------------

_COPY_API = {"cuda": ("cudaStreamCreateWithFlags", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaStreamDestroy"),
             "hip": ("hipStreamCreateWithFlags", "hipMemcpyAsync", "hipStreamSynchronize", "hipStreamDestroy")}
_NON_BLOCKING = 0x01  # cudaStreamNonBlocking == hipStreamNonBlocking
_HOST_TO_DEVICE = 1  # cudaMemcpyHostToDevice == hipMemcpyHostToDevice
#: cudaMemcpyDeviceToDevice == hipMemcpyDeviceToDevice (cuda_runtime_api.h / driver_types.h; hip_runtime_api.h).
DEVICE_TO_DEVICE = 3
HOST_TO_DEVICE = _HOST_TO_DEVICE

#: Address ranges [start, end) page-locked through pin(), for is_pinned().
_pinned_ranges: list[tuple[int, int]] = []


def pin(runtime: str | None, address: int, nbytes: int, device_id: int = 0) -> str:
    """Page-lock memory the caller owns (e.g. a shared-memory mapping) with ``runtime``'s host registration,
    portable to every context. '' when pinned, else why not. Undo with :func:`unpin` before the memory goes."""
    if runtime is None:
        return "no GPU runtime (CPU target)"
    lib, reason = load_runtime(runtime)
    if lib is None:
        return reason
    refused = register(lib, runtime, address, nbytes, device_id)
    if refused:
        return refused
    with _lock:
        _pinned_ranges.append((address, address + nbytes))
    return ""


def unpin(runtime: str, address: int, device_id: int = 0) -> None:
    """Undo :func:`pin` for the range starting at ``address``."""
    with _lock:
        _pinned_ranges[:] = [r for r in _pinned_ranges if r[0] != address]
    lib, _ = load_runtime(runtime)
    if lib is None:
        return
    set_device(lib, runtime, device_id)  # on the pinning device
    unregister(lib, runtime, address)


def is_pinned(address: int, nbytes: int) -> bool:
    """Whether [address, address + nbytes) lies inside memory page-locked through :func:`pin`."""
    end = address + nbytes
    return any(start <= address and end <= stop for start, stop in _pinned_ranges)


class DeviceStream:
    """A compute stream of our own on one device, for a provider that takes a caller's stream (its
    ``stream_option``): sessions built with its :attr:`handle` queue their work on it. Several sessions on one
    stream run one after another in launch order, the next launched while the last still runs, instead of side
    by side on streams of their own (serve's ``--streams shared``, plan.py). Non-blocking, as ONNX Runtime's own
    streams are: it does not wait for the legacy default stream. :meth:`close` once every session on it is gone.

    Not run on AMD hardware: the HIP calls are hipStreamCreateWithFlags and hipStreamDestroy, with CUDA's flag.
    """

    def __init__(self, runtime: str, device_id: int = 0):
        self.runtime, self.device_id = runtime, device_id
        self.handle = 0
        lib, reason = load_runtime(runtime)
        if lib is None:
            raise RuntimeError(reason)
        names = _COPY_API[runtime]
        create = getattr(lib, names[0], None)
        if create is None:
            raise RuntimeError(f"the {runtime} runtime lacks {names[0]}")
        set_device(lib, runtime, device_id)
        stream = ctypes.c_void_p()
        create.argtypes, create.restype = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint], ctypes.c_int
        status = create(ctypes.byref(stream), _NON_BLOCKING)
        if status != 0:
            raise RuntimeError(refusal(lib, runtime, names[0], status, device_id))
        self._lib, self.handle = lib, int(stream.value or 0)

    def close(self) -> None:
        """Destroy the stream (after the sessions that used it)."""
        if self.handle:
            destroy = getattr(self._lib, _COPY_API[self.runtime][3], None)
            if destroy is not None:
                destroy.argtypes, destroy.restype = [ctypes.c_void_p], ctypes.c_int
                destroy(ctypes.c_void_p(self.handle))
            self.handle = 0


class DeviceCopier:
    """Copies host pieces one after another into a device buffer: an asynchronous copy per piece on a stream of
    its own, then one wait for all of them.

    For joining a batch on the GPU instead of the host: each request's rows go from where they already are (a
    shared-memory arena page-locked with :func:`pin`) to their rows of the device input, by DMA, without a host
    copy. The copy calls keep the GIL (they only queue work, microseconds each); the wait releases it once per
    batch. A host-side join instead releases and retakes the GIL for every row, and next to other busy threads
    each retake waits (a fraction of a millisecond per image-sized row: the history of docs/BENCHMARKS.md).
    Sources must be page-locked: from ordinary memory an "asynchronous" copy is a synchronous staged one, with
    the GIL held.

    Not run on AMD hardware: the HIP calls (hipStreamCreateWithFlags, hipMemcpyAsync, hipStreamSynchronize)
    are written to the HIP runtime API with CUDA's argument order and flag values.
    """

    def __init__(self, runtime: str, device_id: int = 0):
        self.runtime, self.device_id = runtime, device_id
        self._lib, self.reason = load_runtime(runtime)
        self._stream: ctypes.c_void_p | None = None
        self._own: DeviceStream | None = None
        self._copy = self._wait = None

    def _start(self) -> None:
        lib, names = self._lib, _COPY_API[self.runtime]
        if lib is None:
            raise RuntimeError(self.reason)
        create, copy, wait = (getattr(lib, n, None) for n in names[:3])
        if create is None or copy is None or wait is None:
            raise RuntimeError(f"the {self.runtime} runtime lacks {', '.join(names[:3])}")
        self._own = DeviceStream(self.runtime, self.device_id)
        stream = ctypes.c_void_p(self._own.handle)
        prototype = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                      ctypes.c_void_p)
        self._copy = prototype(ctypes.cast(copy, ctypes.c_void_p).value)  # keeps the GIL: it only queues
        wait.argtypes, wait.restype = [ctypes.c_void_p], ctypes.c_int  # a CDLL call: releases the GIL
        self._wait, self._stream = wait, stream

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            raise RuntimeError(refusal(self._lib, self.runtime, call, status, self.device_id))

    def copy(self, jobs: list[tuple[int, list[tuple[int, int]]]], kind: int = _HOST_TO_DEVICE) -> None:
        """For each (device destination, pieces) job, copy its (host address, bytes) pieces to the destination
        onwards, in order; return when every copy is done (one wait for all jobs). Raises RuntimeError with the
        runtime's error code, after the copies already queued have finished (so that the caller may write the
        same device memory, or free the sources, once it has the error). ``kind``: DEVICE_TO_DEVICE for pieces
        that are device memory of the same device (ready: the producer synchronised its own stream)."""
        if self._stream is None:
            self._start()
        queued = False
        try:
            for destination, pieces in jobs:
                at = destination
                for address, nbytes in pieces:
                    self._check(self._copy(at, address, nbytes, kind, self._stream),
                                _COPY_API[self.runtime][1])
                    queued = True
                    at += nbytes
        except RuntimeError:
            if queued:
                self._wait(self._stream)
                clear_error(self._lib, self.runtime)
            raise
        self._check(self._wait(self._stream), _COPY_API[self.runtime][2])

    def close(self) -> None:
        """Destroy the copy stream (the next copy makes a new one)."""
        if self._own is not None:
            self._own.close()
            self._own = None
        self._stream = None
