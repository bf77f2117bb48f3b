"""AMD GPUs: through the amdsmi library when ROCm's libamd_smi is there, else ``amd-smi``, else ``rocminfo``
with ``rocm-smi --json`` for memory in use.

``import amdsmi`` without ROCm prints to stdout and raises ``KeyError: 'libamd_smi.so'`` (seen with the PyPI
amdsmi 7.0.2 on a host without ROCm), so the import is guarded with ``except Exception`` and its printing is
swallowed (it would corrupt ``--json`` output).

When a tool refuses because the amdgpu driver is missing or out of reach, its message is translated
(system/amd_diagnosis.py) and kept as ``AmdInventory.problem``, so the doctor can say why and what to do.
"""

from __future__ import annotations

import contextlib
import functools
import io
from dataclasses import dataclass, field

from onnxaccel.engines.ort import capture_native_stderr
from onnxaccel.system.amd_diagnosis import AmdProblem, explain_rocminfo, plain
from onnxaccel.system.amd_parsers import RocmAgent, ToolOutputError, parse_amd_smi_json, parse_rocm_smi_json, \
    parse_rocminfo
from onnxaccel.system.gpu_sample import GpuSample
from onnxaccel.system.tools import run_tool


@dataclass
class AmdGpu:
    """One AMD GPU as the inventory lists it: name, gfx architecture, compute units, VRAM, driver."""
    index: int
    name: str
    gfx: str | None = None
    compute_units: int | None = None
    vram_total_bytes: int | None = None
    vram_used_bytes: int | None = None
    driver_version: str | None = None

    @property
    def vram_free_bytes(self) -> int | None:
        """VRAM not in use (total minus used), or None when either is unknown."""
        if self.vram_total_bytes is None or self.vram_used_bytes is None:
            return None
        return max(self.vram_total_bytes - self.vram_used_bytes, 0)

    def to_dict(self) -> dict:
        """The GPU as JSON-ready values, free VRAM included."""
        return {"index": self.index, "name": self.name, "gfx": self.gfx, "compute_units": self.compute_units,
                "vram_total_bytes": self.vram_total_bytes, "vram_used_bytes": self.vram_used_bytes,
                "vram_free_bytes": self.vram_free_bytes, "driver_version": self.driver_version}


@dataclass
class AmdInventory:
    """The AMD GPUs found and by which source, with why the other sources gave nothing."""
    gpus: list[AmdGpu] = field(default_factory=list)
    #: "amdsmi", "amd-smi", "rocminfo" or "none".
    source: str = "none"
    #: Why each source that was tried gave nothing (shown by the doctor).
    notes: list[str] = field(default_factory=list)
    hsa_runtime_version: str | None = None
    #: The first tool that said why it sees no GPU (driver not loaded, /dev/kfd out of reach), translated.
    problem: AmdProblem | None = None

    def to_dict(self) -> dict:
        """The inventory as JSON-ready values."""
        return {"source": self.source, "gpus": [g.to_dict() for g in self.gpus], "notes": self.notes,
                "hsa_runtime_version": self.hsa_runtime_version,
                "problem": self.problem.to_dict() if self.problem else None}


@functools.lru_cache(maxsize=1)
def import_amdsmi():
    """(module, None) or (None, why). Cached: a failed import prints each time it is tried."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), capture_native_stderr() as native:
        try:
            import amdsmi
        except ModuleNotFoundError:
            return None, "the amdsmi Python package is not installed"
        except Exception as exc:  # noqa: BLE001 - KeyError('libamd_smi.so') without ROCm (amdsmi 7.0.2)
            said = " ".join((printed.getvalue() + native.text()).split())
            return None, f"amdsmi cannot load ROCm's libamd_smi.so ({type(exc).__name__}: {exc}) {said}".strip()
    return amdsmi, None


def discover_amd() -> AmdInventory:
    """List AMD GPUs from the first source that sees any: the amdsmi library, then rocminfo (with
    rocm-smi's memory), then the amd-smi CLI; never raises."""
    inventory = AmdInventory()
    for source, finder in (("amdsmi", _from_amdsmi), ("rocminfo", _from_rocminfo), ("amd-smi", _from_amd_smi_cli)):
        try:
            gpus, note = finder(inventory)
        except ToolOutputError as exc:
            gpus, note = [], str(exc)
        if note:
            inventory.notes.append(f"{source}: {note}")
        if gpus:
            inventory.gpus, inventory.source = gpus, source
            break
    return inventory


def _from_amdsmi(inventory: AmdInventory) -> tuple[list[AmdGpu], str | None]:
    amdsmi, why = import_amdsmi()
    if amdsmi is None:
        return [], why
    try:
        amdsmi.amdsmi_init()
    except Exception as exc:  # noqa: BLE001 - AmdSmiLibraryException: driver not loaded, no permission...
        return [], f"amdsmi_init failed: {exc}"
    gpus = []
    try:
        for index, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
            asic = _call(amdsmi.amdsmi_get_gpu_asic_info, handle) or {}
            vram = amdsmi.AmdSmiMemoryType.VRAM
            driver = _call(amdsmi.amdsmi_get_gpu_driver_info, handle) or {}
            gpus.append(AmdGpu(
                index=index, name=str(asic.get("market_name") or "AMD GPU"),
                gfx=asic.get("target_graphics_version") if str(asic.get("target_graphics_version", "")).startswith("gfx") else None,
                compute_units=asic.get("num_compute_units") if isinstance(asic.get("num_compute_units"), int) else None,
                vram_total_bytes=_call(amdsmi.amdsmi_get_gpu_memory_total, handle, vram),  # bytes (§6.1)
                vram_used_bytes=_call(amdsmi.amdsmi_get_gpu_memory_usage, handle, vram),
                driver_version=driver.get("driver_version"),
            ))
    finally:
        with contextlib.suppress(Exception):
            amdsmi.amdsmi_shut_down()
    return gpus, None if gpus else "amdsmi found no GPU"


def _call(function, *args):
    try:
        value = function(*args)
    except Exception:  # noqa: BLE001 - one unsupported query must not hide the GPU
        return None
    return None if value == "N/A" else value


def _from_rocminfo(inventory: AmdInventory) -> tuple[list[AmdGpu], str | None]:
    run = run_tool(["rocminfo"])
    if run.error:
        return [], run.error
    if not run.ok and "HSA Agents" not in run.stdout:
        problem = explain_rocminfo(run.stdout, run.stderr)
        if problem is not None:
            inventory.problem = inventory.problem or problem
            return [], problem.summary  # the doctor shows the fix with its finding
        # Its own messages are on stdout; stderr has those of the commands it runs (lsmod in 5.x).
        said = (plain(run.stdout).strip() or run.stderr.strip()).splitlines()
        return [], f"rocminfo failed (exit {run.returncode}): {said[-1] if said else 'no output'}"
    report = parse_rocminfo(run.stdout)
    inventory.hsa_runtime_version = report.runtime_version
    readings = _rocm_smi_readings()
    gpus = []
    for index, agent in enumerate(report.gpus):
        reading = readings[index] if len(readings) == len(report.gpus) else None
        gpus.append(_merge(index, agent, reading))
    return gpus, None if gpus else "rocminfo lists no GPU agent"


def _rocm_smi_readings() -> list[GpuSample]:
    run = run_tool(["rocm-smi", "--showuse", "--showmeminfo", "vram", "--showproductname", "--json"])
    if not run.ok:
        return []
    try:
        return parse_rocm_smi_json(run.stdout)
    except ToolOutputError:
        return []


def _merge(index: int, agent: RocmAgent, reading: GpuSample | None) -> AmdGpu:
    return AmdGpu(
        index=index, name=agent.marketing_name or (reading.name if reading else None) or agent.gfx,
        gfx=agent.gfx, compute_units=agent.compute_units,
        vram_total_bytes=(reading.memory_total_bytes if reading else None) or agent.vram_bytes,
        vram_used_bytes=reading.memory_used_bytes if reading else None,
    )


def _from_amd_smi_cli(inventory: AmdInventory) -> tuple[list[AmdGpu], str | None]:
    static = run_tool(["amd-smi", "static", "--asic", "--vram", "--driver", "--json"])
    if static.error:
        return [], static.error
    if not static.ok:
        return [], f"amd-smi static failed (exit {static.returncode})"
    readings = parse_amd_smi_json(static.stdout)
    metric = run_tool(["amd-smi", "metric", "--mem-usage", "--json"])
    used = {r.gpu: r.memory_used_bytes for r in parse_amd_smi_json(metric.stdout)} if metric.ok else {}
    return [AmdGpu(r.gpu, r.name or r.gfx or "AMD GPU", r.gfx, r.compute_units, r.memory_total_bytes,
                   used.get(r.gpu), r.driver_version) for r in readings], None
