"""Translate ONNX Runtime's provider-load errors into what to do about them.

Each pattern is a real message (each seen with onnxruntime 1.32.0, onnxruntime-migraphx 1.27.1 or onnxruntime-gpu 1.31.1 on a host without ROCm or CUDA). ``doctor`` uses the
same table, so a finding reads the same everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Diagnosis:
    """A runtime message translated: what is wrong (``cause``) and what to do about it (``fix``)."""
    cause: str
    fix: str


# Missing shared libraries, by soname prefix -> (what it is, how to get it).
_LIBS: tuple[tuple[str, str, str], ...] = (
    ("libmigraphx_c.so", "MIGraphX (AMD)", "Install ROCm 7.x with MIGraphX from AMD's repositories "
     "(`apt install migraphx`, see docs/AMD.md) and make /opt/rocm/lib visible (ldconfig or LD_LIBRARY_PATH)."),
    ("libamdhip64.so", "the HIP runtime (ROCm)", "Install ROCm 7.x (HIP soname 7) from AMD's repositories; "
     "onnxruntime-migraphx >= 1.23 and onnxruntime-rocm 1.22 link libamdhip64.so.7."),
    ("libhipblas.so", "hipBLAS (ROCm)", "Install the ROCm 7.x math libraries (hipblas, miopen-hip) from AMD's "
     "repositories."),
    ("libMIOpen.so", "MIOpen (ROCm)", "Install miopen-hip from ROCm 7.x."),
    ("librocm_smi64.so", "ROCm SMI", "Install rocm-smi-lib from ROCm 7.x."),
    ("libroctracer64.so", "roctracer (ROCm)", "Install roctracer from ROCm 7.x."),
    ("libcublasLt.so", "cuBLAS (CUDA)", "Install the CUDA libraries onnxruntime-gpu was built for: "
     "`pip install 'onnxruntime-gpu[cuda,cudnn]'` (CUDA 13 / cuDNN 9 for 1.27+; CUDA 12 for 1.22-1.26)."),
    ("libcublas.so", "cuBLAS (CUDA)", "`pip install 'onnxruntime-gpu[cuda,cudnn]'`, or install the CUDA toolkit "
     "of the major version onnxruntime-gpu was built for."),
    ("libcudart.so", "the CUDA runtime", "`pip install 'onnxruntime-gpu[cuda,cudnn]'`, or install the CUDA "
     "toolkit of the major version onnxruntime-gpu was built for."),
    ("libcurand.so", "cuRAND (CUDA)", "`pip install 'onnxruntime-gpu[cuda,cudnn]'`."),
    ("libcufft.so", "cuFFT (CUDA)", "`pip install 'onnxruntime-gpu[cuda,cudnn]'`."),
    ("libcudnn", "cuDNN 9", "`pip install nvidia-cudnn-cu13` (or cu12 for onnxruntime-gpu <= 1.26)."),
    ("libnvinfer", "TensorRT", "Install TensorRT 10 (`pip install tensorrt-cu13` or NVIDIA's packages) and put "
     "its libraries on LD_LIBRARY_PATH; or use --target cuda."),
    ("libcuda.so", "the NVIDIA driver", "No NVIDIA driver is loaded: install the driver, or in a container "
     "run with --gpus all."),
)

_PATTERNS: tuple[tuple[re.Pattern, str, str], ...] = (
    (re.compile(r"Invalid device ID: (\d+), must be between 0 \(inclusive\) and (\d+)"),
     "device id {0} does not exist: the runtime sees {1} GPU(s)",
     "Use a device id below {1}; check HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES."),
    (re.compile(r"Unknown Provider Type: (\w+)"),
     "this onnxruntime build does not know {0}",
     "Install the onnxruntime package that contains it (see `onnxaccel doctor`)."),
    (re.compile(r'Unknown provider option: "?([\w.]+)"?'),
     "the provider rejected the option '{0}'",
     "Remove it; `onnxaccel doctor --target T` lists the options the installed provider knows."),
    (re.compile(r"Require cuDNN (\S+) and CUDA (\S+)\."),
     "the CUDA provider needs cuDNN {0} and CUDA {1}, which were not found",
     "`pip install 'onnxruntime-gpu[cuda,cudnn]'` and call onnxruntime.preload_dlls(), or install CUDA {1} "
     "and cuDNN {0} system-wide."),
    (re.compile(r"HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENT"),
     "the ROCm runtime rejected the call (HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENT): usually ROCm components "
     "from different releases, or a GPU the build has no code for",
     "Keep every ROCm component on one release (docs/AMD.md); check the gfx target with `onnxaccel doctor`."),
    (re.compile(r"no CUDA-capable device is detected|CUDA failure 100"),
     "no CUDA GPU is visible", "Check nvidia-smi and CUDA_VISIBLE_DEVICES; in a container use --gpus all."),
    (re.compile(r"hipErrorNoDevice|no ROCm-capable device"),
     "no AMD GPU is visible",
     "Check rocminfo; the user needs the video and render groups; in a container pass /dev/kfd and /dev/dri."),
    (re.compile(r"Please install TensorRT libraries"),
     "the TensorRT libraries are not installed",
     "Install TensorRT 10 and put its libraries on LD_LIBRARY_PATH, or use --target cuda."),
    # For the doctor: the Python wrapper's warning when a provider is not in the build
    # (onnxruntime_inference_collection.py, seen on 1.32.0 and 1.27.1).
    (re.compile(r"Specified provider '(\w+)' is not in available provider names"),
     "this onnxruntime build does not include {0}",
     "Install the onnxruntime distribution that provides it (`onnxaccel doctor` names it) instead of this one."),
    # cudaErrorInsufficientDriver (35) and cudaErrorNoKernelImageForDevice (209), CUDA runtime error strings.
    (re.compile(r"CUDA driver version is insufficient for CUDA runtime version"),
     "the NVIDIA driver is older than the CUDA runtime onnxruntime-gpu uses",
     "Update the NVIDIA driver to one whose CUDA version (nvidia-smi, top right) is at least the wheel's "
     "(CUDA 13 for onnxruntime-gpu >= 1.27, CUDA 12 for 1.22-1.26)."),
    (re.compile(r"no kernel image is available for execution on the device"),
     "the onnxruntime-gpu build has no kernels for this GPU's compute capability",
     "Use an onnxruntime-gpu build compiled for this GPU (older GPUs need an older CUDA 12 build), or --target cpu."),
)

_CANNOT_OPEN = re.compile(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file")


def diagnose(text: str) -> Diagnosis | None:
    """Return the cause and the fix for the first known failure in an ONNX Runtime message or log."""
    missing = _CANNOT_OPEN.findall(text)
    # The provider library itself is named in "Failed to load library X with error: Y: cannot open": Y is
    # the dependency that is really missing, so prefer sonames that are not onnxruntime's own.
    missing = [m for m in missing if "onnxruntime_providers" not in m] or missing
    for soname in missing:
        for prefix, what, fix in _LIBS:
            if soname.startswith(prefix):
                return Diagnosis(f"{soname} ({what}) cannot be loaded", fix)
    if missing:
        return Diagnosis(f"{missing[0]} cannot be loaded", "Install the library that provides it.")
    for pattern, cause, fix in _PATTERNS:
        match = pattern.search(text)
        if match:
            return Diagnosis(cause.format(*match.groups()), fix.format(*match.groups()))
    return None


#: ONNX Runtime's refusal of a bound output whose shape the graph contradicts (InferenceSession::ValidateOutputs,
#: 1.32: "Invalid rank for output: y Got: 3 Expected: 2 Please fix either the inputs/outputs or the model." and
#: "Got invalid dimensions for output: y for the following indices index: 0 Got: 24 Expected: 1 ...").
_OUTPUT_SHAPE = re.compile(r"(Invalid rank|Got invalid dimensions) for output: (\S+)")


def output_shape_mismatch(text: str) -> tuple[str, str] | None:
    """(output name, "rank" or "dimensions") where ONNX Runtime refused an output for contradicting the shape the
    model declares for it; None for any other message."""
    match = _OUTPUT_SHAPE.search(text)
    if match is None:
        return None
    return match.group(2), "rank" if match.group(1) == "Invalid rank" else "dimensions"


def first_error_line(text: str) -> str:
    """The most telling line of an ONNX Runtime log: the last one that mentions a failure."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if any(w in line for w in ("error", "Error", "Failed", "FAIL", "Require")):
            return line
    return lines[-1] if lines else ""
