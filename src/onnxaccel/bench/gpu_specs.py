"""Peak compute and memory bandwidth of GPUs, per precision, each with its source.

Figures are the vendors' dense (no structured sparsity) peaks at boost clock. ``fp32`` is the non-tensor /
vector rate (AMD CDNA: the FP32 *matrix* rate, which rocBLAS/MIOpen use for GEMM and convolution);
``tf32`` is the tensor-core rate that the CUDA EP uses for FP32 MatMul/Conv while ``use_tf32`` is on (its
default since ONNX Runtime 1.18, cuda_execution_provider_info.h). ``int8`` is in TOPS. ``None`` = not
published by the source.

Devices that ROCm shows as several GPUs (MI250X/MI250: two GCDs per package) are listed per GCD, because
one ONNX Runtime session runs on one GCD; the package figure is half of what AMD quotes for the module.

Sources (vendor pages; for H100/H200/MI300X, secondary pages quoting the same numbers were used to cross-check):
  NVIDIA H200: https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: FP16 1,979 TFLOPS with sparsity,
      989.4 dense; INT8 3,958 TOPS with sparsity; TF32 989 with sparsity; FP32 67; 4.8 TB/s; 141 GB; 700 W)
  NVIDIA H100: https://www.nvidia.com/en-us/data-center/h100/ (SXM 3.35 TB/s; PCIe 2.0 TB/s, FP16 756 dense)
  NVIDIA A100: nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (FP16 312, INT8 624, TF32 156, FP32 19.5;
      80GB SXM 2,039 GB/s; 40GB 1,555 GB/s; cross-check glennklockwood.com/garden/processors/A100)
  NVIDIA L4: https://www.nvidia.com/en-us/data-center/l4/ (FP16 242 / INT8 485 with sparsity -> 121 / 242.5
      dense; TF32 120 with sparsity -> 60; FP32 30.3; 300 GB/s; 72 W)
  NVIDIA L40S: https://www.nvidia.com/en-us/data-center/l40s/ (FP16 733 / INT8 1,466 with sparsity -> 362 /
      733 dense; TF32 366 sparse -> 183; FP32 91.6; 864 GB/s)
  NVIDIA A10: https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (FP16 125, INT8 250, TF32 62.5,
      FP32 31.2; 600 GB/s)
  NVIDIA T4: https://www.nvidia.com/en-us/data-center/tesla-t4/ (FP16 65, INT8 130, FP32 8.1; 320 GB/s)
  AMD MI300X: https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html (FP16 1,307.4,
      INT8 2,614.9, FP32 163.4; 5.3 TB/s; 192 GB; 750 W)
  AMD MI325X: https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html (compute as MI300X;
      6 TB/s; 256 GB)
  AMD MI250X / MI250 / MI210: AMD Instinct MI200 spec pages (https://www.amd.com/en/products/accelerators/
      instinct/mi200.html): MI250X FP16 383 TFLOPS / FP32 matrix 95.7 / 3.2 TB/s per module; MI250 362.1 /
      90.5 / 3.2 TB/s; MI210 181 / 45.3 / 1.6 TB/s, INT8 = FP16 rate (cross-check: AnandTech 17326 table)
  AMD Radeon PRO W7900: https://www.amd.com/en/products/graphics/workstations/radeon-pro/w7900.html
      (FP16 122.64 TFLOPS, FP32 61.3; 864 GB/s; 48 GB; 295 W)
  AMD Radeon RX 7900 XTX: https://www.amd.com/en/products/graphics/desktops/radeon/7000-series/
      amd-radeon-rx-7900xtx.html (FP16 122.8 TFLOPS, FP32 61.4; 960 GB/s; 24 GB; 355 W)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from onnxaccel import providers


@dataclass(frozen=True)
class GpuSpec:
    """Published peak figures of one GPU model, used for roofline percentages; ``source`` says where from."""
    name: str
    vendor: str
    #: Peak dense TFLOP/s (TOPS for int8) by precision key: fp32, tf32, fp16, int8.
    peak_tflops: dict[str, float | None]
    bandwidth_gbps: float
    memory_gb: float
    power_w: float | None
    source: str
    note: str = ""
    patterns: tuple[str, ...] = field(default=(), repr=False)

    def peak(self, key: str) -> float | None:
        """Peak TFLOP/s for a precision key (fp32, tf32, fp16, int8), or None when not published."""
        return self.peak_tflops.get(key)

    def to_dict(self) -> dict:
        """JSON-ready form of the spec (without the name patterns)."""
        return {"name": self.name, "vendor": self.vendor, "peak_tflops": dict(self.peak_tflops),
                "bandwidth_gbps": self.bandwidth_gbps, "memory_gb": self.memory_gb, "power_w": self.power_w,
                "source": self.source, "note": self.note}


def _spec(name, vendor, fp32, tf32, fp16, int8, bw, mem, power, source, *patterns, note=""):
    return GpuSpec(name, vendor, {"fp32": fp32, "tf32": tf32, "fp16": fp16, "int8": int8}, bw, mem, power,
                   source, note, patterns)


_NV = "https://www.nvidia.com/en-us/data-center/"
_MI200 = "https://www.amd.com/en/products/accelerators/instinct/mi200.html"
_PER_GCD = "per GCD: ROCm shows each of the two GCDs as one GPU; the module has twice these figures"

# Order matters: the first entry whose pattern matches the device name wins (more specific names first).
SPECS: tuple[GpuSpec, ...] = (
    _spec("NVIDIA H200", "nvidia", 67.0, 494.7, 989.4, 1978.9, 4800, 141, 700, _NV + "h200/", r"\bH200\b"),
    _spec("NVIDIA H100 PCIe", "nvidia", 51.0, 378.0, 756.0, 1513.0, 2000, 80, 350, _NV + "h100/",
          r"\bH100\b.*\bPCIe\b"),
    _spec("NVIDIA H100 SXM", "nvidia", 66.9, 494.7, 989.4, 1978.9, 3350, 80, 700, _NV + "h100/", r"\bH100\b"),
    _spec("NVIDIA A100 40GB", "nvidia", 19.5, 156.0, 312.0, 624.0, 1555, 40, 400,
          "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf", r"\bA100\b.*\b40\s?GB\b"),
    _spec("NVIDIA A100 80GB", "nvidia", 19.5, 156.0, 312.0, 624.0, 2039, 80, 400,
          "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf", r"\bA100\b"),
    _spec("NVIDIA L40S", "nvidia", 91.6, 183.0, 362.05, 733.0, 864, 48, 350, _NV + "l40s/", r"\bL40S\b"),
    _spec("NVIDIA L4", "nvidia", 30.3, 60.0, 121.0, 242.5, 300, 24, 72, _NV + "l4/", r"\bL4\b"),
    _spec("NVIDIA A10", "nvidia", 31.2, 62.5, 125.0, 250.0, 600, 24, 150, _NV + "products/a10-gpu/", r"\bA10\b"),
    _spec("NVIDIA T4", "nvidia", 8.1, None, 65.0, 130.0, 320, 16, 70, _NV + "tesla-t4/", r"\bT4\b",
          note="Turing has no TF32: FP32 runs at the FP32 rate"),
    _spec("AMD Instinct MI325X", "amd", 163.4, None, 1307.4, 2614.9, 6000, 256, 1000,
          "https://www.amd.com/en/products/accelerators/instinct/mi300/mi325x.html", r"MI325X"),
    _spec("AMD Instinct MI300X", "amd", 163.4, None, 1307.4, 2614.9, 5300, 192, 750,
          "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html", r"MI300X"),
    _spec("AMD Instinct MI250X (one GCD)", "amd", 47.85, None, 191.5, 191.5, 1638, 64, 280, _MI200, r"MI250X",
          note=_PER_GCD),
    _spec("AMD Instinct MI250 (one GCD)", "amd", 45.25, None, 181.05, 181.05, 1638, 64, 250, _MI200,
          r"MI250(?!X)", note=_PER_GCD),
    _spec("AMD Instinct MI210", "amd", 45.3, None, 181.0, 181.0, 1638, 64, 300, _MI200, r"MI210"),
    _spec("AMD Radeon PRO W7900", "amd", 61.3, None, 122.64, None, 864, 48, 295,
          "https://www.amd.com/en/products/graphics/workstations/radeon-pro/w7900.html", r"W7900"),
    _spec("AMD Radeon RX 7900 XTX", "amd", 61.4, None, 122.8, None, 960, 24, 355,
          "https://www.amd.com/en/products/graphics/desktops/radeon/7000-series/amd-radeon-rx-7900xtx.html",
          r"7900\s*XTX"),
)


def lookup(device_name: str | None) -> GpuSpec | None:
    """The spec whose pattern matches ``device_name`` (as NVML, amdsmi or rocm-smi report it), or None."""
    if not device_name:
        return None
    for spec in SPECS:
        if any(re.search(p, device_name, re.IGNORECASE) for p in spec.patterns):
            return spec
    return None


def names() -> list[str]:
    """Names of every known GPU spec, for help texts and errors."""
    return [s.name for s in SPECS]


def peak_key(precision: str, device: str, options: dict[str, str], spec: GpuSpec) -> str:
    """Which peak applies: FP16/INT8 as named; FP32 on NVIDIA counts TF32 while the CUDA EP's use_tf32 is on
    (default) and the GPU has TF32 units."""
    if precision != "fp32":
        return precision
    provider = providers.get(device) if device in providers.devices() else None
    if provider is None or not provider.tf32_default or not spec.peak("tf32"):
        return "fp32"
    if provider.tf32_option is None or options.get(provider.tf32_option, "1") != "0":
        return "tf32"
    return "fp32"
