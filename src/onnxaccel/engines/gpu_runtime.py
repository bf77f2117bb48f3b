"""The GPU runtime library of a target (the CUDA runtime or HIP), opened with ctypes once per process, and
its refusals in words: which call failed with which code, and for HIP what stands behind it on this machine.

Used by engines/hostmem.py (page-locked buffers, direct copies, the GPU wait mode). Not run on AMD hardware:
the HIP calls are written to the HIP runtime API (hip_runtime_api.h) with the same calls and flag values as
CUDA's; what ran here is Debian's HIP 5.2 runtime without a GPU (see engines/hostmem.py).
"""

from __future__ import annotations

import ctypes
import os
import threading

PORTABLE = 0x01  # cudaHostRegisterPortable == hipHostRegisterPortable

#: Runtime library per vendor: the name stem searched in the process's loaded libraries, then sonames to load.
#: HIP's soname follows the ROCm major: .so.7 (ROCm 7.x, the PyPI AMD wheels), .so.6 (ROCm 6.x), .so.5 (ROCm
#: 5.x; Debian 12's libamdhip64-5 package installs /usr/lib/x86_64-linux-gnu/libamdhip64.so.5, HIP 5.2).
_LIBRARIES = {
    "cuda": ("libcudart", ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so")),
    "hip": ("libamdhip64", ("libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so")),
}
_API = {"cuda": ("cudaHostRegister", "cudaHostUnregister", "cudaGetErrorString", "cudaGetLastError",
                 "cudaSetDevice"),
        "hip": ("hipHostRegister", "hipHostUnregister", "hipGetErrorString", "hipGetLastError", "hipSetDevice")}

_lock = threading.Lock()
_loaded: dict[str, tuple[ctypes.CDLL | None, str]] = {}


def runtime_for(device: str) -> str | None:
    """The GPU runtime that owns ``device``'s memory: 'cuda', 'hip', or None for the CPU."""
    if device in ("cuda", "tensorrt"):
        return "cuda"
    if device in ("rocm", "migraphx"):
        return "hip"
    return None


def _loaded_path(stem: str) -> str | None:
    """The path of an already loaded library whose file name starts with ``stem`` (the one the GPU provider
    uses), from /proc/self/maps; None where there is none or no /proc."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1] if "/" in line else ""
                if path.rsplit("/", 1)[-1].startswith(stem + "."):
                    return path
    except OSError:
        return None
    return None


def load_runtime(kind: str) -> tuple[ctypes.CDLL | None, str]:
    """The runtime library (loaded once per process) and, when it cannot be used, why."""
    with _lock:
        if kind in _loaded:
            return _loaded[kind]
        stem, names = _LIBRARIES[kind]
        candidates = [p for p in (_loaded_path(stem),) if p] + list(names)
        lib, reason = None, f"{stem} is not loaded and none of {', '.join(names)} could be opened"
        for name in candidates:
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            reg, unreg, error_string = (getattr(lib, n, None) for n in _API[kind][:3])
            if reg is None or unreg is None:
                lib, reason = None, f"{name} has no {_API[kind][0]}"
                continue
            reg.argtypes, reg.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint], ctypes.c_int
            unreg.argtypes, unreg.restype = [ctypes.c_void_p], ctypes.c_int
            if error_string is not None:
                error_string.argtypes, error_string.restype = [ctypes.c_int], ctypes.c_char_p
            last_error, setter = (getattr(lib, n, None) for n in _API[kind][3:])
            if last_error is not None:
                last_error.argtypes, last_error.restype = [], ctypes.c_int
            if setter is not None:
                setter.argtypes, setter.restype = [ctypes.c_int], ctypes.c_int
            reason = ""
            break
        _loaded[kind] = (lib, reason)
        return lib, reason


#: hipError_t codes that a machine whose AMD GPU is out of reach answers, and what each means.
#: include/hip/hip_runtime_api.h, enum hipError_t: ROCm/HIP@50ec90c65cc383f676c099ecb0546e183851f6b1 (rocm-6.2.0),
#: the same values at ROCm/HIP@206b6de40698e20b2310c6dd22241ac9cad574ae (rocm-5.2.3); vendored in
#: tests/system/upstream/hip_runtime_api_rocm-*.txt. hipGetErrorName of the HIP 5.2 runtime here
#: returns these names.
HIP_ERRORS = {
    35: ("hipErrorInsufficientDriver", "the amdgpu kernel driver is older than this HIP runtime needs"),
    100: ("hipErrorNoDevice", "the HIP runtime sees no AMD GPU"),
    101: ("hipErrorInvalidDevice", "the GPU index is not one that the HIP runtime sees"),
}
HIP_NO_GPU_FIX = ("install and load the amdgpu kernel driver (amdgpu-dkms, or sudo modprobe amdgpu), and give this "
                  "user /dev/kfd and /dev/dri/renderD* (render and video groups; in a container "
                  "--device=/dev/kfd --device=/dev/dri). onnxaccel doctor --target migraphx says which is missing.")


def _amdgpu_state() -> str:
    """Why the kernel side of an AMD GPU is missing, read where rocminfo reads it (/sys/module/amdgpu, then
    /dev/kfd: rocminfo.cc CheckInitialState, ROCm/rocminfo@c6f7a17c85e0cdd75bf062e7a3490e831c87eb94); '' when
    both are there and usable."""
    if not os.path.isdir("/sys/module/amdgpu"):
        return "the amdgpu kernel driver is not loaded (/sys/module/amdgpu is absent)"
    if not os.path.exists("/dev/kfd"):
        return "/dev/kfd does not exist"
    if not os.access("/dev/kfd", os.R_OK | os.W_OK):
        return "/dev/kfd is not readable and writable by this user"
    return ""


def _hip_diagnosis(lib, status: int, device_id: int) -> str:
    """For a HIP refusal, what stands behind it: the device count HIP sees and the driver's state."""
    if status == 35:
        return f": {HIP_ERRORS[35][1]}. Fix: install the amdgpu driver of the same ROCm release as {lib._name}"
    if status not in (100, 101) or getattr(lib, "hipGetDeviceCount", None) is None:
        return ""
    count = ctypes.c_int(0)
    counted = lib.hipGetDeviceCount(ctypes.byref(count))
    clear_error(lib, "hip")
    if counted == 0 and count.value > 0:
        return (f": GPU {device_id} is not one of the {count.value} that {lib._name} sees. Fix: use a device id "
                f"from 0 to {count.value - 1} (migraphx:N), or check HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES")
    name = HIP_ERRORS.get(counted, ("hipError_t",))[0]
    why = _amdgpu_state() or "the driver is loaded and /dev/kfd is usable, yet the runtime found no GPU"
    return (f": no AMD GPU visible to {lib._name} (hipGetDeviceCount: error {counted} {name}): {why}. "
            f"Fix: {HIP_NO_GPU_FIX}")


def refusal(lib, runtime: str, call: str, status: int, device_id: int) -> str:
    """'CALL failed: error N (name)' and, for HIP, what stands behind it and the fix."""
    text = getattr(lib, _API[runtime][2], None)
    try:
        message = text(status).decode() if text is not None else ""
    except Exception:  # noqa: BLE001 - the code alone still says what failed
        message = ""
    clear_error(lib, runtime)
    said = f"{call} failed: error {status}" + (f" ({message})" if message else "")
    return said + (_hip_diagnosis(lib, status, device_id) if runtime == "hip" else "")


def clear_error(lib, runtime: str) -> None:
    """Reset the runtime's per-thread last error after a refused call: ONNX Runtime's CUDA kernels check
    cudaGetLastError after every launch and would report ours as theirs on the next run."""
    last_error = getattr(lib, _API[runtime][3], None)
    if last_error is not None:
        last_error()


def set_device(lib, runtime: str, device_id: int) -> None:
    """Make ``device_id`` current for this thread's runtime calls, so no context appears on GPU 0."""
    setter = getattr(lib, _API[runtime][4], None)
    if setter is not None:
        setter(int(device_id))


def register(lib, runtime: str, address: int, nbytes: int, device_id: int) -> str:
    """Page-lock [address, address + nbytes) on ``device_id`` (portable to every context): '' or why not."""
    api = _API[runtime]
    set_device(lib, runtime, device_id)  # register on the model's device
    status = getattr(lib, api[0])(address, nbytes, PORTABLE)
    if status == 0:
        return ""
    return refusal(lib, runtime, api[0], status, device_id)


def unregister(lib, runtime: str, address: int) -> None:
    """Undo :func:`register` (a refusal only clears the runtime's last error)."""
    if getattr(lib, _API[runtime][1])(address) != 0:
        clear_error(lib, runtime)

