"""Environment variables that change what ONNX Runtime, ROCm and CUDA do, each shown with its effect."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from onnxaccel import providers
from onnxaccel.system.findings import INFO, WARN, Finding
from onnxaccel.system.gfx import gfx_from_override

# What each variable does. Sources: ROCm docs (HIP/ROCR visible devices, HSA override);
# ORT_MIGRAPHX_* from the strings of libonnxruntime_providers_migraphx.so 1.27.1 and microsoft/onnxruntime
# onnxruntime/core/providers/migraphx/migraphx_execution_provider.cc at 03c1250 (GET_ENV_* after the options),
# where environment variables take precedence over provider options.
_EFFECTS = {
    "HIP_VISIBLE_DEVICES": "HIP (MIGraphX, the ROCm EP) sees only these AMD GPUs, renumbered from 0",
    "ROCR_VISIBLE_DEVICES": "the ROCm runtime exposes only these AMD GPUs (applied before HIP_VISIBLE_DEVICES)",
    "GPU_DEVICE_ORDINAL": "OpenCL/HIP see only these AMD GPUs",
    "CUDA_VISIBLE_DEVICES": "CUDA sees only these NVIDIA GPUs, renumbered from 0",
    "CUDA_DEVICE_ORDER": "CUDA numbers GPUs in this order (PCI_BUS_ID matches NVML and nvidia-smi)",
    "HSA_OVERRIDE_GFX_VERSION": "the ROCm runtime reports every AMD GPU as this architecture",
    "ORT_MIGRAPHX_FP16_ENABLE": "the MIGraphX EP quantizes every model to FP16 (overrides the provider option)",
    "ORT_MIGRAPHX_BF16_ENABLE": "the MIGraphX EP quantizes every model to BF16 (overrides the provider option)",
    "ORT_MIGRAPHX_FP8_ENABLE": "the MIGraphX EP quantizes every model to FP8 (overrides the provider option)",
    "ORT_MIGRAPHX_INT8_ENABLE": "the MIGraphX EP quantizes every model to INT8 (overrides the provider option)",
    "ORT_MIGRAPHX_INT8_CALIBRATION_TABLE_NAME": "INT8 calibration table file name",
    "ORT_MIGRAPHX_INT8_USE_NATIVE_CALIBRATION_TABLE": "read the INT8 table in TensorRT's text format",
    "ORT_MIGRAPHX_CACHE_PATH": "directory of INT8 calibration tables",
    "ORT_MIGRAPHX_MODEL_CACHE_PATH": "compiled MIGraphX programs are saved to and loaded from this directory",
    "ORT_MIGRAPHX_DUMP_MODEL_OPS": "the MIGraphX EP prints the operators it cannot run",
    "ORT_MIGRAPHX_EXHAUSTIVE_TUNE": "the MIGraphX EP tunes every kernel exhaustively (compiles take much longer)",
    "MIGRAPHX_DISABLE_MLIR": "MIGraphX does not use MLIR kernels",
    "MIGRAPHX_ENABLE_NHWC": "MIGraphX converts convolutions to NHWC",
    "LD_LIBRARY_PATH": "shared libraries (ROCm, CUDA, cuDNN) are searched here first",
    "ROCM_PATH": "where ROCm is installed (default /opt/rocm)",
    "OMP_NUM_THREADS": "thread count of OpenMP-based CPU kernels",
}
#: Removed in ROCm 6.4 (microsoft/onnxruntime gh-pages docs/execution-providers/MIGraphX-ExecutionProvider.md):
#: setting them does nothing any more.
_REMOVED = ("ORT_MIGRAPHX_SAVE_COMPILED_MODEL", "ORT_MIGRAPHX_SAVE_COMPILED_PATH",
            "ORT_MIGRAPHX_LOAD_COMPILED_MODEL", "ORT_MIGRAPHX_LOAD_COMPILED_PATH")


@dataclass(frozen=True)
class EnvSetting:
    """An environment variable that changes how a runtime behaves, its value and what it does."""
    name: str
    value: str
    effect: str

    def to_dict(self) -> dict:
        """The setting as JSON-ready values."""
        return {"name": self.name, "value": self.value, "effect": self.effect}


def relevant_environment(environ: Mapping[str, str] | None = None) -> list[EnvSetting]:
    """The variables of :data:`_EFFECTS` (plus any other ORT_MIGRAPHX_* / MIGRAPHX_*) that are set."""
    environ = os.environ if environ is None else environ
    found = []
    for name in sorted(environ):
        if name in _EFFECTS:
            effect = _EFFECTS[name]
        elif name in _REMOVED:
            effect = "removed in ROCm 6.4: ignored; use ORT_MIGRAPHX_MODEL_CACHE_PATH"
        elif name.startswith(("ORT_MIGRAPHX_", "MIGRAPHX_")):
            effect = "read by MIGraphX or its EP (see the MIGraphX docs)"
        else:
            continue
        found.append(EnvSetting(name, environ[name], _specific(name, environ[name], effect)))
    return found


def _specific(name: str, value: str, effect: str) -> str:
    if name == "HSA_OVERRIDE_GFX_VERSION":
        gfx = gfx_from_override(value)
        return f"every AMD GPU runs as {gfx}" if gfx else "malformed (expected MAJOR.MINOR.STEPPING, e.g. 11.0.0)"
    if name.endswith("VISIBLE_DEVICES") and value.strip() in ("", "-1", "none", "NoDevFiles"):
        return effect + ": no GPU is visible"
    return effect


def environment_findings(environ: Mapping[str, str] | None = None) -> list[Finding]:
    """Findings about variables set in ``environ`` (default: this process's): ones that hide every GPU, a
    malformed HSA_OVERRIDE_GFX_VERSION, settings removed in ROCm 6.4, several ROCm releases on
    LD_LIBRARY_PATH; each with its fix."""
    environ = os.environ if environ is None else environ
    findings = []
    for name in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        value = environ.get(name)
        if value is not None and value.strip() in ("", "-1", "none", "NoDevFiles"):
            findings.append(Finding(WARN, "gpus-hidden", f"{name}={value!r} hides every GPU",
                                    "The runtime sees no device of this vendor.", f"unset {name}"))
    override = environ.get("HSA_OVERRIDE_GFX_VERSION")
    if override is not None and gfx_from_override(override) is None:
        findings.append(Finding(WARN, "hsa-override-malformed", f"HSA_OVERRIDE_GFX_VERSION={override!r} is malformed",
                                "The value must be MAJOR.MINOR.STEPPING, e.g. 11.0.0 for gfx1100.",
                                "Fix the value or unset HSA_OVERRIDE_GFX_VERSION."))
    for name in _REMOVED:
        if name in environ:
            findings.append(Finding(INFO, "migraphx-env-removed", f"{name} has no effect since ROCm 6.4",
                                    "The save/load options were replaced by the model cache.",
                                    "Use ORT_MIGRAPHX_MODEL_CACHE_PATH (or the provider option "
                                    f"{next(iter(providers.get('migraphx').compile_cache.options))})."))
    ld_path = environ.get("LD_LIBRARY_PATH", "")
    releases = sorted({m.group(1) for m in re.finditer(r"/opt/rocm-([\d.]+)", ld_path)})
    if len(releases) > 1:
        findings.append(Finding(WARN, "rocm-mixed-ld-path", f"LD_LIBRARY_PATH names several ROCm releases: "
                                f"{', '.join(releases)}", "Libraries of different releases get mixed, the classic "
                                "cause of HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENT.",
                                "Keep one ROCm release on LD_LIBRARY_PATH."))
    return findings
