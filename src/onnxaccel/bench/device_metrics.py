"""GPU utilization, memory and power of the GPU a target runs on, from the telemetry sampler.

The sampler (``system.telemetry.GpuSampler``) numbers GPUs as NVML / amdsmi do: every GPU in the machine.
A runtime numbers only the visible ones: ``CUDA_VISIBLE_DEVICES=3`` makes NVML's GPU 3 the CUDA EP's
device 0 (CUDA C Programming Guide, "CUDA Environment Variables"); ``HIP_VISIBLE_DEVICES`` /
``ROCR_VISIBLE_DEVICES`` do the same on ROCm. Indices (not UUIDs) in those variables are mapped here.
Memory used is GPU-wide (every process), so the "delta" against a reading before the session was created is
the better estimate of what the cell itself took.
"""

from __future__ import annotations

import os

from onnxaccel.target import Target

_VENDOR = {"cuda": "nvidia", "tensorrt": "nvidia", "migraphx": "amd", "rocm": "amd"}
_VISIBLE = {"nvidia": ("CUDA_VISIBLE_DEVICES",), "amd": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")}


def physical_index(target: Target) -> tuple[str | None, int]:
    """(vendor, index as the sampler numbers it) of the GPU the target runs on."""
    vendor = _VENDOR.get(target.device)
    index = target.device_id or 0
    for var in _VISIBLE.get(vendor, ()):
        value = os.environ.get(var, "").strip()
        if not value:
            continue
        items = [v.strip() for v in value.split(",")]
        if index < len(items) and items[index].isdigit():
            return vendor, int(items[index])
        break
    return vendor, index


class DeviceMonitor:
    """Starts a sampler around a measurement; a no-op for CPU targets, for ``target=None`` (telemetry off), or
    when no backend opens."""

    def __init__(self, target: Target | None, interval: float = 0.1, sampler_factory=None):
        self.target = target
        self.interval = interval
        self.vendor, self.index = physical_index(target) if target is not None else (None, 0)
        self._factory = sampler_factory
        self._sampler = None

    def _make(self):
        if self._factory is not None:
            return self._factory(self.interval)
        from onnxaccel.system.telemetry import GpuSampler

        return GpuSampler(interval=self.interval)

    def snapshot(self) -> dict | None:
        """One reading now (memory before the session exists), or None."""
        if self.vendor is None:
            return None
        try:
            sampler = self._make().start()
            return self._pick(sampler.stop())
        except Exception:  # noqa: BLE001 - telemetry never fails a benchmark
            return None

    def start(self) -> None:
        """Start sampling the target's GPU; nothing for a CPU target or when no backend opens."""
        if self.vendor is None:
            return
        try:
            self._sampler = self._make().start()
        except Exception:  # noqa: BLE001
            self._sampler = None

    def stop(self) -> dict | None:
        """Stop sampling and return the target GPU's figures (mean/peak), or None when nothing was sampled."""
        if self._sampler is None:
            return None
        try:
            return self._pick(self._sampler.stop())
        except Exception:  # noqa: BLE001
            return None
        finally:
            self._sampler = None

    def _pick(self, summary) -> dict:
        gpu = summary.gpu(self.index, self.vendor)
        if gpu is None:
            return {"available": False, "backends": list(summary.backends),
                    "notes": list(summary.notes) + list(summary.errors)[:3]
                    or [f"no {self.vendor} GPU {self.index} among the sampled GPUs"]}
        stats = gpu.to_dict()
        return {
            "available": True, "gpu": gpu.gpu, "name": gpu.name, "vendor": gpu.vendor, "samples": gpu.samples,
            "backends": list(summary.backends), "interval_s": summary.interval_s,
            "utilization_pct": stats["utilization_pct"], "memory_used_bytes": stats["memory_used_bytes"],
            "memory_total_bytes": stats["memory_total_bytes"], "power_w": stats["power_w"],
            "temperature_c": stats["temperature_c"], "gfx_clock_mhz": stats["gfx_clock_mhz"],
        }
