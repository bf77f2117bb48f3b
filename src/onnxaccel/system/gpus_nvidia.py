"""NVIDIA GPUs: through NVML (the nvidia-ml-py package, module ``pynvml``), else ``nvidia-smi``.

Without a driver ``nvmlInit()`` raises ``NVMLError_LibraryNotFound`` ("NVML Shared Library Not Found", seen with
nvidia-ml-py 13.615.71 on a host without a driver); that is the normal state of a machine without an NVIDIA GPU
and becomes the note "no NVIDIA driver", never an error. The PyPI package ``pynvml`` is a deprecated shim over
nvidia-ml-py.
"""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from onnxaccel.install import install_command
from onnxaccel.system.findings import ERROR, INFO, OK, WARN, Finding
from onnxaccel.system.tools import run_tool

MIB = 1024 * 1024
_MISSING = {"", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]"}


class NvmlUnavailable(Exception):
    """NVML cannot be used here; the message says why in words a user understands."""


@contextlib.contextmanager
def nvml() -> Iterator[object]:
    """``with nvml() as pynvml:`` initializes NVML and shuts it down; raises NvmlUnavailable with the reason."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable(f"nvidia-ml-py is not installed ({install_command('nvidia')})") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(_nvml_reason(pynvml, exc)) from None
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _nvml_reason(pynvml, exc: Exception) -> str:
    value = getattr(exc, "value", None)
    if value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "no NVIDIA driver: libnvidia-ml.so.1 (NVML, installed with the driver) was not found"
    if value == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return "the NVIDIA driver is installed but not loaded (nvidia kernel module missing)"
    if value == getattr(pynvml, "NVML_ERROR_NO_PERMISSION", object()):
        return "no permission to talk to the NVIDIA driver (/dev/nvidia*)"
    return f"NVML failed to initialize: {exc}"


def nvml_optional(pynvml, function, *args):
    """Call an NVML query; None when the GPU does not support it (NVMLError_NotSupported and friends)."""
    try:
        return function(*args)
    except pynvml.NVMLError:
        return None


@dataclass
class NvidiaGpu:
    """One NVIDIA GPU as the inventory lists it: name, compute capability, memory, UUID."""
    index: int
    name: str
    compute_capability: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    uuid: str | None = None

    @property
    def memory_free_bytes(self) -> int | None:
        """Memory not in use (total minus used), or None when either is unknown."""
        if self.memory_total_bytes is None or self.memory_used_bytes is None:
            return None
        return max(self.memory_total_bytes - self.memory_used_bytes, 0)

    def to_dict(self) -> dict:
        """The GPU as JSON-ready values, free memory included."""
        return {"index": self.index, "name": self.name, "compute_capability": self.compute_capability,
                "memory_total_bytes": self.memory_total_bytes, "memory_used_bytes": self.memory_used_bytes,
                "memory_free_bytes": self.memory_free_bytes, "uuid": self.uuid}


@dataclass
class NvidiaInventory:
    """The NVIDIA GPUs, driver and CUDA driver versions found, and by which source."""
    gpus: list[NvidiaGpu] = field(default_factory=list)
    driver_version: str | None = None
    #: Highest CUDA version the driver supports, e.g. "13.0" (nvmlSystemGetCudaDriverVersion).
    cuda_driver_version: str | None = None
    source: str = "none"
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The inventory as JSON-ready values."""
        return {"source": self.source, "driver_version": self.driver_version,
                "cuda_driver_version": self.cuda_driver_version, "gpus": [g.to_dict() for g in self.gpus],
                "notes": self.notes}


def discover_nvidia() -> NvidiaInventory:
    """List NVIDIA GPUs through NVML, else ``nvidia-smi``; never raises (the notes say why nothing was
    found)."""
    inventory = NvidiaInventory()
    try:
        with nvml() as pynvml:
            _from_nvml(pynvml, inventory)
            inventory.source = "nvml"
            return inventory
    except NvmlUnavailable as exc:
        inventory.notes.append(f"nvml: {exc}")
    _from_nvidia_smi(inventory)
    return inventory


def _from_nvml(pynvml, inventory: NvidiaInventory) -> None:
    inventory.driver_version = nvml_optional(pynvml, pynvml.nvmlSystemGetDriverVersion)
    cuda = nvml_optional(pynvml, pynvml.nvmlSystemGetCudaDriverVersion)
    if isinstance(cuda, int) and cuda > 0:  # 13000 -> "13.0" (NVML encodes major * 1000 + minor * 10)
        inventory.cuda_driver_version = f"{cuda // 1000}.{(cuda % 1000) // 10}"
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml_optional(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle)
        capability = nvml_optional(pynvml, pynvml.nvmlDeviceGetCudaComputeCapability, handle)
        inventory.gpus.append(NvidiaGpu(
            index=index, name=str(nvml_optional(pynvml, pynvml.nvmlDeviceGetName, handle) or "NVIDIA GPU"),
            compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            uuid=nvml_optional(pynvml, pynvml.nvmlDeviceGetUUID, handle),
        ))


#: Fields asked of nvidia-smi; compute_cap exists in drivers from 2021 on, hence the retry without it.
SMI_FIELDS = ("index", "name", "memory.total", "memory.used", "driver_version", "uuid", "compute_cap")


def nvidia_smi_query(fields: Sequence[str]) -> list[dict[str, str | None]] | str:
    """Rows of ``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits``, or why it failed."""
    run = run_tool(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if run.error:
        return run.error
    if not run.ok:
        said = (run.stdout.strip() or run.stderr.strip()).splitlines()
        return f"nvidia-smi failed (exit {run.returncode}): {said[0] if said else 'no output'}"
    return parse_nvidia_smi_csv(run.stdout, fields)


def parse_nvidia_smi_csv(text: str, fields: Sequence[str]) -> list[dict[str, str | None]]:
    """One dict per GPU line; "N/A" and "[Not Supported]" become None. Raises ValueError on a ragged line."""
    rows = []
    for values in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not values:
            continue
        if len(values) != len(fields):
            raise ValueError(f"nvidia-smi printed {len(values)} values for {len(fields)} fields: {', '.join(values)}")
        rows.append({f: (None if v.strip() in _MISSING else v.strip()) for f, v in zip(fields, values, strict=True)})
    return rows


def _from_nvidia_smi(inventory: NvidiaInventory) -> None:
    rows = nvidia_smi_query(SMI_FIELDS)
    if isinstance(rows, str) and "compute_cap" in rows:
        rows = nvidia_smi_query(SMI_FIELDS[:-1])
    if isinstance(rows, str):
        inventory.notes.append(f"nvidia-smi: {rows}")
        return
    for position, row in enumerate(rows):
        inventory.driver_version = inventory.driver_version or row.get("driver_version")
        inventory.gpus.append(NvidiaGpu(
            index=int(row["index"]) if row.get("index") else position, name=row.get("name") or "NVIDIA GPU",
            compute_capability=row.get("compute_cap"),
            memory_total_bytes=_mib(row.get("memory.total")), memory_used_bytes=_mib(row.get("memory.used")),
            uuid=row.get("uuid"),
        ))
    inventory.source = "nvidia-smi" if inventory.gpus else "none"


def _mib(value: str | None) -> int | None:
    try:
        return int(float(value) * MIB) if value is not None else None  # nounits: memory.* are MiB
    except ValueError:
        return None


#: pip wheels that bring CUDA and cuDNN for onnxruntime-gpu (its PyPI metadata, `pip install --dry-run
#: --report`: 1.27+ use CUDA 13 names, 1.22-1.26 the -cu12 ones); onnxruntime.preload_dlls() loads them.
CUDA_PIP_PACKAGES = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12",
                     "nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cublas", "nvidia-cublas-cu12")


def cuda_pip_packages() -> dict[str, str]:
    """Installed pip packages that ship CUDA libraries (nvidia-* wheels), name -> version: the CUDA EP
    can load its libraries from them."""
    from importlib import metadata

    found = {}
    for name in CUDA_PIP_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def cuda_findings(inventory: NvidiaInventory, wheel_cuda: str | None, pip_cuda: dict[str, str]):
    """Driver, CUDA and cuDNN against what the installed onnxruntime-gpu was built for."""
    findings = []
    if not inventory.gpus:
        return findings
    names = ", ".join(f"{g.name} (compute capability {g.compute_capability or '?'})" for g in inventory.gpus)
    findings.append(Finding(OK, "nvidia-gpus", f"{len(inventory.gpus)} NVIDIA GPU(s): {names}",
                            f"driver {inventory.driver_version or '?'}, supports CUDA "
                            f"{inventory.cuda_driver_version or '?'} (read with {inventory.source})"))
    if wheel_cuda is None:
        return findings
    wheel_major = int(wheel_cuda.split(".")[0])
    if inventory.cuda_driver_version is not None and int(inventory.cuda_driver_version.split(".")[0]) < wheel_major:
        findings.append(Finding(ERROR, "cuda-driver-too-old", f"The driver supports CUDA {inventory.cuda_driver_version}, "
                                f"onnxruntime-gpu was built for CUDA {wheel_cuda}", "The CUDA EP will not start.",
                                f"Update the NVIDIA driver to one that supports CUDA {wheel_major}, or install an "
                                "onnxruntime-gpu built for your CUDA (1.22-1.26 use CUDA 12)."))
    wrong = [n for n in pip_cuda if n.endswith(f"-cu{12 if wheel_major == 13 else 13}")]
    if wrong:
        findings.append(Finding(WARN, "cuda-pip-mismatch", f"pip CUDA libraries for the other CUDA major are installed: "
                                f"{', '.join(wrong)}", f"onnxruntime-gpu needs CUDA {wheel_major} libraries.",
                                "pip install 'onnxruntime-gpu[cuda,cudnn]' (brings the matching ones)."))
    if pip_cuda:
        listed = ", ".join(f"{k} {v}" for k, v in pip_cuda.items())
        findings.append(Finding(INFO, "cuda-pip", f"CUDA/cuDNN from pip: {listed}",
                                "onnxruntime.preload_dlls() loads these before a CUDA session."))
    return findings
