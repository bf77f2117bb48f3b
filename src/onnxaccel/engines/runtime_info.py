"""What a compiled program depends on besides the model: runtime versions and the hardware it was built for.

Below the pipeline (engines layer), so the compile caches (transform/compile_cache.py) and the artifacts
store the pipeline loads from (engines/artifacts.py) key what they hold by the same facts.

Read cheaply from files and package metadata (no GPU library is loaded):

* ONNX Runtime: the installed distribution and version (``onnxruntime``, ``onnxruntime-gpu``,
  ``onnxruntime-migraphx``... each ships its own build of the providers).
* ROCm / MIGraphX: ``/opt/rocm/.info/version`` and the versioned ``libmigraphx_c.so.*`` file name; the AMD
  GPU architecture from KFD's topology (``/sys/class/kfd/kfd/topology/nodes/*/properties``,
  ``gfx_target_version``, e.g. 90402 for gfx942).
* NVIDIA: the driver from ``/proc/driver/nvidia/version``, GPU models from ``/proc/driver/nvidia/gpus/*/
  information``, TensorRT and the CUDA runtime from package metadata or ``libnvinfer.so.*``.
* CPU: machine type and ``model name`` from ``/proc/cpuinfo`` (an ORT graph optimized at level ``all`` is
  laid out for the CPU it was optimized on).
"""

from __future__ import annotations

import contextlib
import glob
import os
import platform
import re
from importlib import metadata
from pathlib import Path

from onnxaccel.engines.ort import installed_distributions
from onnxaccel.target import Target


def runtime_versions(target: Target) -> dict[str, str]:
    """Versions of everything that builds or runs a compiled program for ``target``."""
    found = {f"dist:{name}": version for name, version in installed_distributions().items()}
    with contextlib.suppress(Exception):
        import onnxruntime

        found["onnxruntime"] = onnxruntime.__version__
    if target.device in ("migraphx", "rocm"):
        found.update(_rocm_versions())
    if target.device in ("cuda", "tensorrt"):
        found.update(_nvidia_versions(tensorrt=target.device == "tensorrt"))
    return found


def host_id(target: Target) -> str:
    """The hardware a program is compiled for: the CPU model, or the GPU models / architectures."""
    if target.device == "cpu":
        return f"{platform.machine()} {_cpu_model()}".strip()
    if target.device in ("migraphx", "rocm"):
        archs = _kfd_gfx_targets()
        return "amd " + (",".join(archs) if archs else "unknown-gpu")
    if target.device in ("cuda", "tensorrt"):
        models = _nvidia_gpus()
        return "nvidia " + (",".join(models) if models else "unknown-gpu")
    return target.device


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _rocm_versions() -> dict[str, str]:
    out = {}
    rocm = Path(os.environ.get("ROCM_PATH", "/opt/rocm"))
    with contextlib.suppress(OSError):
        out["rocm"] = (rocm / ".info" / "version").read_text().strip()
    libs = sorted(glob.glob(str(rocm / "lib" / "libmigraphx_c.so.*")), key=len)
    if libs:
        out["migraphx_c"] = Path(libs[-1]).name
    with contextlib.suppress(metadata.PackageNotFoundError):
        out["migraphx"] = metadata.version("migraphx")
    return out


def _kfd_gfx_targets() -> list[str]:
    """gfx names from KFD topology: gfx_target_version 90402 -> gfx942, 110000 -> gfx1100, 90010 -> gfx90a."""
    names = set()
    for props in glob.glob("/sys/class/kfd/kfd/topology/nodes/*/properties"):
        with contextlib.suppress(OSError, ValueError):
            text = Path(props).read_text()
            found = re.search(r"gfx_target_version\s+(\d+)", text)
            if found and int(found.group(1)):
                value = int(found.group(1))
                major, minor, step = value // 10000, (value // 100) % 100, value % 100
                names.add(f"gfx{major}{minor:x}{step:x}")
    return sorted(names)


def _nvidia_versions(*, tensorrt: bool) -> dict[str, str]:
    out = {}
    with contextlib.suppress(OSError):
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
        found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", first)
        out["nvidia_driver"] = found.group(1) if found else first.strip()
    for dist in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    if tensorrt:
        for dist in ("tensorrt", "tensorrt-cu12", "tensorrt-cu13", "tensorrt-libs", "tensorrt_libs"):
            with contextlib.suppress(metadata.PackageNotFoundError):
                out[dist] = metadata.version(dist)
        libs = sorted({Path(p).name for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d
                       for p in glob.glob(os.path.join(d, "libnvinfer.so.*"))})
        if libs:
            out["libnvinfer"] = libs[-1]
    return out


def _nvidia_gpus() -> list[str]:
    models = []
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        with contextlib.suppress(OSError):
            for line in Path(info).read_text().splitlines():
                if line.startswith("Model:"):
                    models.append(line.split(":", 1)[1].strip())
    return models
