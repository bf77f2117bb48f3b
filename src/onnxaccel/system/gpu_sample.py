"""One reading of one GPU, whoever took it: the telemetry backends (NVML, amdsmi, ``rocm-smi --json``) and the
AMD tool parsers behind the doctor's inventory (``rocm-smi``/``amd-smi`` JSON) all give a :class:`GpuSample`.

Units are the same for every source: percent, bytes, watts, degrees Celsius, MHz; None where the source had
no value ("N/A", a sensor the GPU lacks).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

#: Fields only an inventory listing fills (``amd-smi static``): left out of :meth:`GpuSample.to_dict` when unset,
#: so a telemetry reading's dict keeps its keys.
_STATIC = ("gfx", "compute_units", "driver_version")


@dataclass(frozen=True)
class GpuSample:
    """One GPU's readings at one moment; ``gpu`` is its index as the source numbers it (every GPU in the
    machine for NVML / amdsmi / rocm-smi, not only the visible ones)."""

    gpu: int
    #: None where a tool listing had no name (the backends always give one).
    name: str | None
    vendor: str
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    gfx_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    #: What an inventory listing adds: the gfx architecture, compute units, driver version.
    gfx: str | None = None
    compute_units: int | None = None
    driver_version: str | None = None

    def to_dict(self) -> dict:
        """The readings as JSON-ready values (the static fields only where a listing gave them)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in _STATIC or getattr(self, f.name) is not None}
