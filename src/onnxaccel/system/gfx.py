"""Which AMD GPU architectures (gfx targets) MIGraphX and the onnxruntime-rocm wheel have code for.

Sources:
* MIGraphX 2.18/2.19 and AMD's ORT 1.29 list gfx950, gfx942, gfx90a, gfx1200, gfx1201, gfx1100, gfx1101, gfx1102
  (2.19 adds gfx1103) and gfx1150-gfx1153
  (https://rocm.docs.amd.com/projects/AMDMIGraphX/en/docs-2.19.0/install/install-migraphx.html).
  Other targets may work but AMD does not build or test for them.
* onnxruntime-rocm 1.22.2.post3 (PyPI) embeds HIP code objects for gfx908, gfx90a, gfx942, gfx1030, gfx1100,
  gfx1101, gfx1200, gfx1201 only; no gfx950, gfx1102 or gfx115x (read from the .hip_fatbin section of its
  libonnxruntime_providers_rocm.so: its hipv4-amdgcn-amd-amdhsa--gfxNNN code objects).
"""

from __future__ import annotations

import re

from onnxaccel.system.findings import ERROR, INFO, OK, WARN, Finding

MIGRAPHX_GFX = frozenset({
    "gfx950", "gfx942", "gfx90a", "gfx1200", "gfx1201", "gfx1100", "gfx1101", "gfx1102", "gfx1103",
    "gfx1150", "gfx1151", "gfx1152", "gfx1153",
})
ORT_ROCM_WHEEL_GFX = frozenset({"gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100", "gfx1101", "gfx1200", "gfx1201"})

_OVERRIDE = re.compile(r"^\s*(\d+)\.(\d+)\.(\d+)\s*$")


def gfx_from_override(value: str) -> str | None:
    """HSA_OVERRIDE_GFX_VERSION=MAJOR.MINOR.STEPPING names gfx{MAJOR}{MINOR}{STEPPING as hex}.

    11.0.0 -> gfx1100, 10.3.0 -> gfx1030, 9.4.2 -> gfx942, 9.0.10 -> gfx90a (the stepping is one hex digit,
    as in the KFD's gfx_target_version: 90010 is gfx90a). None when the value is malformed.
    """
    found = _OVERRIDE.match(value or "")
    if not found:
        return None
    major, minor, stepping = (int(g) for g in found.groups())
    if stepping > 15 or minor > 15:
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


def effective_gfx(gfx: str, override: str | None) -> str:
    """The target the ROCm runtime treats the GPU as: the override when one is set and well formed."""
    return (gfx_from_override(override) if override else None) or gfx


def check_gfx(gfx: str, *, device: str, override: str | None = None) -> Finding:
    """Whether ``device`` ('migraphx' or 'rocm') has code for this GPU, given HSA_OVERRIDE_GFX_VERSION."""
    runs_as = effective_gfx(gfx, override)
    spoofed = f" (HSA_OVERRIDE_GFX_VERSION={override} makes the runtime treat it as {runs_as})" \
        if runs_as != gfx else ""
    if device == "migraphx":
        if runs_as in MIGRAPHX_GFX:
            if runs_as != gfx:
                return Finding(WARN, "gfx-overridden", f"{gfx} runs as {runs_as} for MIGraphX{spoofed}",
                               "Kernels built for another architecture may crash or compute wrong results.",
                               "Check outputs against the CPU (`onnxaccel compare`); unset the override if they differ.")
            return Finding(OK, "gfx-supported", f"{gfx} is a MIGraphX-supported target")
        return Finding(WARN, "gfx-unsupported-migraphx", f"{gfx} is not a target MIGraphX supports{spoofed}",
                       f"MIGraphX 2.18/2.19 support {', '.join(sorted(MIGRAPHX_GFX))}; others are not built or "
                       "tested by AMD and may fail to compile kernels.",
                       _override_hint(gfx, MIGRAPHX_GFX, "Use a supported GPU, or --target cpu."))
    if device == "rocm":
        if runs_as in ORT_ROCM_WHEEL_GFX:
            return Finding(OK if runs_as == gfx else WARN, "gfx-supported" if runs_as == gfx else "gfx-overridden",
                           f"onnxruntime-rocm 1.22 has kernels for {runs_as}{spoofed}")
        return Finding(ERROR, "gfx-unsupported-rocm-wheel", f"onnxruntime-rocm 1.22 has no kernels for {runs_as}{spoofed}",
                       f"Its wheel embeds code only for {', '.join(sorted(ORT_ROCM_WHEEL_GFX))}; the ROCm EP has "
                       "nothing to launch on this GPU.",
                       _override_hint(gfx, ORT_ROCM_WHEEL_GFX, "Use --target migraphx with onnxruntime-migraphx, "
                                      "which compiles for the GPU at load time."))
    return Finding(INFO, "gfx", f"{gfx}")


def override_for(gfx: str) -> str | None:
    """The HSA_OVERRIDE_GFX_VERSION value that names ``gfx`` (the inverse of :func:`gfx_from_override`)."""
    found = re.match(r"^gfx(\d+)([0-9a-f])([0-9a-f])$", gfx)
    if not found:
        return None
    return f"{int(found.group(1))}.{int(found.group(2), 16)}.{int(found.group(3), 16)}"


def _override_hint(gfx: str, supported: frozenset[str], otherwise: str) -> str:
    """Suggest the family's supported member (gfx1032 -> gfx1030, gfx1103 -> gfx1100) when there is one."""
    base = gfx[:-1] + "0"
    value = override_for(base)
    if base != gfx and base in supported and value:
        return (f"Unsupported but common: HSA_OVERRIDE_GFX_VERSION={value} runs the GPU as {base}; verify "
                f"results against the CPU (`onnxaccel compare`). Otherwise: {otherwise}")
    return otherwise
