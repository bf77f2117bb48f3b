"""Where GPU readings come from: NVML (NVIDIA), the amdsmi library (AMD), or ``rocm-smi --json`` (AMD, when
ROCm's libamd_smi is missing). Each backend opens once and then ``read()``s every GPU it sees.

Units: NVML gives power in milliwatts and memory in bytes (NVML's nvmlDeviceGetPowerUsage and
nvmlDeviceGetMemoryInfo docs); amdsmi gives memory in bytes from ``amdsmi_get_gpu_memory_usage`` and power in
watts (amdsmi 7.0.2 amdsmi_interface.py); rocm-smi prints watts and bytes (ROCm/rocm_smi_lib
python_smi_tools/rocm_smi.py at a1295714).

Without the amdgpu driver, rocm-smi logs why on stderr and exits 0 with nothing on stdout (run here with
Debian's rocm-smi 5.2.3); that message, not the empty JSON, is what the backend reports
(system/amd_diagnosis.py).
"""

from __future__ import annotations

import contextlib
import dataclasses

from onnxaccel.system.amd_diagnosis import explain_rocm_smi
from onnxaccel.system.amd_parsers import ToolOutputError, parse_rocm_smi_json
from onnxaccel.system.gpu_sample import GpuSample
from onnxaccel.system.gpus_amd import import_amdsmi
from onnxaccel.system.gpus_nvidia import NvmlUnavailable, nvml, nvml_optional
from onnxaccel.system.tools import find_tool, run_tool


class BackendUnavailable(Exception):
    """The backend cannot read anything here; the message says why."""


class NvmlBackend:
    """NVIDIA GPUs through NVML (nvidia-ml-py): utilization, memory, power, temperature, clocks."""
    name = "nvml"
    vendor = "nvidia"

    def __init__(self):
        self._stack: contextlib.ExitStack | None = None
        self._handles: list[tuple[int, str, object]] = []
        self.child_cpu_s = 0.0

    def open(self) -> None:
        """Initialize NVML and list the GPUs; BackendUnavailable when NVML is missing or sees none."""
        stack = contextlib.ExitStack()
        try:
            self.nvml = stack.enter_context(nvml())
        except NvmlUnavailable as exc:
            raise BackendUnavailable(str(exc)) from None
        self._stack = stack
        pynvml = self.nvml
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._handles.append((index, str(nvml_optional(pynvml, pynvml.nvmlDeviceGetName, handle) or "NVIDIA GPU"), handle))
        if not self._handles:
            self.close()
            raise BackendUnavailable("NVML sees no NVIDIA GPU")

    def read(self) -> list[GpuSample]:
        """One reading of every GPU (power converted from NVML's milliwatts to watts)."""
        pynvml, samples = self.nvml, []
        for index, name, handle in self._handles:
            util = nvml_optional(pynvml, pynvml.nvmlDeviceGetUtilizationRates, handle)
            memory = nvml_optional(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = nvml_optional(pynvml, pynvml.nvmlDeviceGetPowerUsage, handle)
            samples.append(GpuSample(
                index, name, self.vendor,
                utilization_pct=float(util.gpu) if util is not None else None,
                memory_used_bytes=int(memory.used) if memory is not None else None,
                memory_total_bytes=int(memory.total) if memory is not None else None,
                power_w=power_mw / 1000.0 if power_mw is not None else None,
                temperature_c=_float(nvml_optional(pynvml, pynvml.nvmlDeviceGetTemperature, handle,
                                                   pynvml.NVML_TEMPERATURE_GPU)),
                gfx_clock_mhz=_float(nvml_optional(pynvml, pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)),
                mem_clock_mhz=_float(nvml_optional(pynvml, pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM)),
            ))
        return samples

    def close(self) -> None:
        """Shut NVML down."""
        if self._stack is not None:
            self._stack.close()
            self._stack = None


class AmdSmiBackend:
    """AMD GPUs through ROCm's amdsmi library: in-process, so cheap enough for a short interval."""
    name = "amdsmi"
    vendor = "amd"

    def __init__(self):
        self._handles: list[tuple[int, str, object]] = []
        self.child_cpu_s = 0.0
        self._open = False

    def open(self) -> None:
        """Initialize amdsmi and list the GPUs; BackendUnavailable with the reason when it cannot."""
        amdsmi, why = import_amdsmi()
        if amdsmi is None:
            raise BackendUnavailable(why)
        try:
            amdsmi.amdsmi_init()
            handles = amdsmi.amdsmi_get_processor_handles()
        except Exception as exc:  # noqa: BLE001 - AmdSmiLibraryException (driver not loaded, permissions)
            raise BackendUnavailable(f"amdsmi_init failed: {exc}") from None
        self.amdsmi, self._open = amdsmi, True
        for index, handle in enumerate(handles):
            asic = self._get(amdsmi.amdsmi_get_gpu_asic_info, handle) or {}
            self._handles.append((index, str(asic.get("market_name") or "AMD GPU"), handle))
        if not self._handles:
            self.close()
            raise BackendUnavailable("amdsmi sees no AMD GPU")

    @staticmethod
    def _get(function, *args):
        try:
            value = function(*args)
        except Exception:  # noqa: BLE001 - AmdSmiLibraryException: not supported on this GPU
            return None
        return None if value == "N/A" else value

    def read(self) -> list[GpuSample]:
        """One reading of every GPU (the hotspot temperature where the GPU has no edge sensor)."""
        amdsmi, samples = self.amdsmi, []
        for index, name, handle in self._handles:
            activity = self._get(amdsmi.amdsmi_get_gpu_activity, handle) or {}
            power = self._get(amdsmi.amdsmi_get_power_info, handle) or {}
            watts = next((_float(power.get(k)) for k in ("socket_power", "current_socket_power", "average_socket_power")
                          if _float(power.get(k))), None)
            temp = self._get(amdsmi.amdsmi_get_temp_metric, handle, amdsmi.AmdSmiTemperatureType.EDGE,
                             amdsmi.AmdSmiTemperatureMetric.CURRENT)
            if temp is None:  # MI300-class GPUs have no edge sensor; hotspot is their junction
                temp = self._get(amdsmi.amdsmi_get_temp_metric, handle, amdsmi.AmdSmiTemperatureType.HOTSPOT,
                                 amdsmi.AmdSmiTemperatureMetric.CURRENT)
            gfx = self._get(amdsmi.amdsmi_get_clock_info, handle, amdsmi.AmdSmiClkType.GFX) or {}
            mem = self._get(amdsmi.amdsmi_get_clock_info, handle, amdsmi.AmdSmiClkType.MEM) or {}
            vram = amdsmi.AmdSmiMemoryType.VRAM
            samples.append(GpuSample(
                index, name, self.vendor, utilization_pct=_float(activity.get("gfx_activity")),
                memory_used_bytes=self._get(amdsmi.amdsmi_get_gpu_memory_usage, handle, vram),
                memory_total_bytes=self._get(amdsmi.amdsmi_get_gpu_memory_total, handle, vram),
                power_w=watts, temperature_c=_float(temp), gfx_clock_mhz=_float(gfx.get("clk")),
                mem_clock_mhz=_float(mem.get("clk")),
            ))
        return samples

    def close(self) -> None:
        """Shut amdsmi down."""
        if self._open:
            with contextlib.suppress(Exception):
                self.amdsmi.amdsmi_shut_down()
            self._open = False


class RocmSmiBackend:
    """``rocm-smi ... --json`` in a subprocess each read: slow (a Python program) but needs no libamd_smi."""

    name = "rocm-smi"
    vendor = "amd"
    ARGS = ("--showuse", "--showmeminfo", "vram", "--showpower", "--showtemp", "--showclocks", "--json")

    def __init__(self, executable: str = "rocm-smi", timeout: float = 10.0):
        self.executable, self.timeout = executable, timeout
        self.names: dict[int, str] = {}
        self.child_cpu_s = 0.0

    def _run(self, *args: str):
        run = run_tool([self.executable, *args], timeout=self.timeout)
        self.child_cpu_s += run.child_cpu_s
        if run.error:
            raise BackendUnavailable(run.error)
        problem = explain_rocm_smi(run.stdout, run.stderr) if not run.stdout.strip() or not run.ok else None
        if problem is not None:
            raise BackendUnavailable(str(problem))
        if not run.ok:
            lines = (run.stderr.strip() or run.stdout.strip()).splitlines()
            raise BackendUnavailable(f"{self.executable} failed (exit {run.returncode}): {lines[-1] if lines else ''}")
        try:
            return parse_rocm_smi_json(run.stdout)
        except ToolOutputError as exc:
            raise BackendUnavailable(str(exc)) from None

    def open(self) -> None:
        """Check the tool runs and list the GPUs' names; BackendUnavailable with rocm-smi's reason."""
        if find_tool(self.executable) is None and "/" not in self.executable:
            raise BackendUnavailable(f"{self.executable} not found")
        readings = self._run("--showproductname", "--json")
        self.names = {r.gpu: r.name or f"AMD GPU {r.gpu}" for r in readings}
        if not self.names:
            raise BackendUnavailable("rocm-smi lists no GPU")

    def read(self) -> list[GpuSample]:
        """One reading of every card from one ``rocm-smi ... --json`` run."""
        return [dataclasses.replace(r, name=self.names.get(r.gpu, r.name or f"AMD GPU {r.gpu}"), vendor=self.vendor)
                for r in self._run(*self.ARGS)]

    def close(self) -> None:
        """Nothing to release: each read is its own process."""
        return None


def open_backends() -> tuple[list, list[str]]:
    """Every backend that opens here (NVML; amdsmi, else rocm-smi), and why each other one did not."""
    opened, notes = [], []
    for candidates in ((NvmlBackend,), (AmdSmiBackend, RocmSmiBackend)):
        for backend_class in candidates:
            backend = backend_class()
            try:
                backend.open()
            except BackendUnavailable as exc:
                notes.append(f"{backend.name}: {exc}")
                continue
            opened.append(backend)
            break
    return opened, notes


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
