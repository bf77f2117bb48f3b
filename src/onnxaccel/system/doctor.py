"""``onnxaccel doctor``: can this machine run models, on which targets, and if not, what to do.

A target is *ready* only when a session built on it keeps its provider (``engines.ort.probe``); the
doctor then adds what the runtime cannot say: conflicting onnxruntime packages, GPUs the wheel has no
code for, a ROCm or driver too old for the wheel, environment variables that hide GPUs.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, field

from onnxaccel import providers
from onnxaccel.install import describe as describe_install
from onnxaccel.install import install_command, swap_command
from onnxaccel.engines.ort import import_ort
from onnxaccel.errors import OnnxAccelError
from onnxaccel.system.environment import EnvSetting, environment_findings, relevant_environment
from onnxaccel.system.findings import ERROR, INFO, OK, WARN, Finding
from onnxaccel.system.gfx import check_gfx
from onnxaccel.system.gpus_amd import AmdInventory, discover_amd
from onnxaccel.system.gpus_nvidia import NvidiaInventory, cuda_findings, cuda_pip_packages, discover_nvidia
from onnxaccel.system.packages import OrtInstall, inspect_ort_install, package_findings
from onnxaccel.engines.ort import probe as probe_target
from onnxaccel.system.rocm import RocmInstall, inspect_rocm, rocm_findings
from onnxaccel.providers import ProviderSpec
from onnxaccel.target import parse_target

SCHEMA = "onnxaccel.doctor/1"
#: Below this much free device memory a GPU is flagged (a ResNet-50 session needs a few hundred MiB).
LOW_FREE_MEMORY = 1 << 30


@dataclass
class TargetVerdict:
    """Whether one target is ready here (a probe session kept its provider) and, if not, why and how
    to fix it."""
    target: str
    provider: str
    ready: bool
    #: Listed by get_available_providers(): the wheel was built with it (says nothing about loading).
    built: bool
    cause: str | None = None
    fix: str | None = None
    details: str | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The verdict as JSON-ready values."""
        return dict(self.__dict__)


@dataclass
class DoctorReport:
    """Everything ``onnxaccel doctor`` found: system, installed runtime, per-target verdicts, GPUs,
    ROCm, environment and the findings with their fixes."""
    system: dict
    runtime: dict
    install: OrtInstall
    targets: list[TargetVerdict]
    nvidia: NvidiaInventory
    amd: AmdInventory
    rocm: RocmInstall | None
    environment: list[EnvSetting]
    findings: list[Finding]
    requested: str | None = None
    #: Every registered provider (onnxaccel.providers), with whether the installed ONNX Runtime has it.
    providers: list[dict] = field(default_factory=list)

    def verdict(self, target: str) -> TargetVerdict | None:
        """The verdict for ``target`` (as text, e.g. "cuda"), or None when it was not probed."""
        return next((v for v in self.targets if v.target == target), None)

    @property
    def ok(self) -> bool:
        """The requested target is ready (without --target: at least one target is)."""
        if self.requested:
            verdict = self.verdict(self.requested)
            return bool(verdict and verdict.ready)
        return any(v.ready for v in self.targets)

    def to_dict(self) -> dict:
        """The report as JSON-ready values, with its schema version."""
        return {
            "schema": SCHEMA, "requested": self.requested, "ok": self.ok, "system": self.system,
            "runtime": self.runtime, "packages": self.install.to_dict(),
            "targets": [v.to_dict() for v in self.targets], "providers": self.providers,
            "gpus": {"nvidia": self.nvidia.to_dict(), "amd": self.amd.to_dict()},
            "rocm": self.rocm.to_dict() if self.rocm else None,
            "environment": [e.to_dict() for e in self.environment],
            "findings": [f.to_dict() for f in self.findings],
        }


def run_doctor(target: str | None = None) -> DoctorReport:
    """Check everything; with ``target`` (e.g. 'cuda', 'migraphx:1') check only that target's readiness."""
    requested = parse_target(target) if target else None
    nvidia, amd = discover_nvidia(), discover_amd()
    vendor = "nvidia" if nvidia.gpus else "amd" if amd.gpus else None
    install = inspect_ort_install()
    findings = [Finding(INFO, "onnxaccel-install", describe_install(),
                        "Fix commands below install the way onnxaccel was installed.")]
    findings += package_findings(install, vendor)
    runtime, ort_problem = _runtime()
    if ort_problem:
        findings.append(Finding(ERROR, "ort-import-failed", "import onnxruntime failed", ort_problem,
                                "Reinstall one onnxruntime distribution (see the findings above)."))
    findings += _gpu_findings(nvidia, amd)
    findings += _amd_driver_findings(amd, install, requested.device if requested else None)
    findings += cuda_findings(nvidia, install.cuda_version, cuda_pip_packages())
    rocm = None
    if amd.gpus or set(_vendor_packages("amd")) & set(install.distributions):
        rocm = inspect_rocm()
        findings += rocm_findings(rocm, install.distributions, amd_gpu=bool(amd.gpus))
    findings += environment_findings()
    built = set(runtime.get("providers", []))
    if requested is not None:
        devices = [requested.device]
    else:
        devices = [s.device for s in _listed_order() if s.provider in built
                   or s.doctor_default and s.vendor in (None, vendor)]
    targets = [_verdict(str(requested) if requested else d, d, runtime, install, nvidia, amd) for d in devices]
    listed = [{**s.to_dict(), "built": s.provider in built} for s in providers.all_specs()]
    return DoctorReport(_system(), runtime, install, targets, nvidia, amd, rocm, relevant_environment(), findings,
                        str(requested) if requested else None, listed)


def _listed_order() -> list[ProviderSpec]:
    """Registered providers in the order targets are listed: GPU providers first (registration order), then
    the rest."""
    return sorted(providers.all_specs(), key=lambda s: not s.is_gpu)


def _vendor_packages(vendor: str) -> tuple[str, ...]:
    """The onnxruntime distributions that bring a provider for ``vendor``'s GPUs."""
    return tuple(dict.fromkeys(s.package[0] for s in providers.all_specs() if s.vendor == vendor))


def _system() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            cpu = next((ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"os": platform.platform(), "python": sys.version.split()[0], "python_executable": sys.executable,
            "machine": platform.machine(), "cpu": cpu, "cpu_count": os.cpu_count()}


def _runtime() -> tuple[dict, str | None]:
    try:
        ort = import_ort()
        return {"version": ort.__version__, "providers": list(ort.get_available_providers()),
                "device": ort.get_device()}, None
    except OnnxAccelError as exc:
        return {}, exc.message
    except Exception as exc:  # noqa: BLE001 - a half-overwritten module fails in many ways
        return {}, f"{type(exc).__name__}: {exc}"


def _gpu_findings(nvidia: NvidiaInventory, amd: AmdInventory) -> list[Finding]:
    findings = []
    if amd.gpus:
        names = ", ".join(f"{g.name} ({g.gfx or '?'})" for g in amd.gpus)
        findings.append(Finding(OK, "amd-gpus", f"{len(amd.gpus)} AMD GPU(s): {names}", f"read with {amd.source}"))
    memories = [(g.index, g.name, g.memory_total_bytes, g.memory_free_bytes) for g in nvidia.gpus]
    memories += [(g.index, g.name, g.vram_total_bytes, g.vram_free_bytes) for g in amd.gpus]
    for index, name, total, free in memories:
        if total and free is not None and free < min(LOW_FREE_MEMORY, total // 10):
            findings.append(Finding(WARN, "gpu-memory-low", f"GPU {index} ({name}) has only "
                                    f"{free / 2**20:.0f} MiB free of {total / 2**30:.1f} GiB",
                                    "Other processes hold its memory; sessions may fail to allocate.",
                                    "Stop them (nvidia-smi / amd-smi process lists them) or use another GPU."))
    if not nvidia.gpus and not amd.gpus:
        findings.append(Finding(INFO, "no-gpu", "No GPU found; the CPU target is the only one that can run here",
                                "; ".join([*nvidia.notes, *amd.notes])))
    return findings


def _amd_driver_findings(amd: AmdInventory, install: OrtInstall, requested: str | None) -> list[Finding]:
    """Why AMD's own tools see no GPU (the amdgpu driver, /dev/kfd), with the fix. An error where an AMD
    target was asked for or an AMD onnxruntime is installed; a warning where only the tools are present."""
    if amd.gpus or amd.problem is None:
        return []
    wanted = (requested is not None and providers.get(requested).vendor == "amd"
              or bool(set(_vendor_packages("amd")) & set(install.distributions)))
    problem = amd.problem
    return [Finding(ERROR if wanted else WARN, problem.code, f"No AMD GPU visible: {problem.cause}",
                    problem.said, problem.fix)]


def _verdict(label: str, device: str, runtime: dict, install: OrtInstall, nvidia: NvidiaInventory,
             amd: AmdInventory) -> TargetVerdict:
    spec = providers.get(device)
    provider = spec.provider
    built = provider in runtime.get("providers", [])
    verdict = TargetVerdict(label, provider, ready=False, built=built)
    package, extra = spec.package
    dists = install.distributions
    swap = swap_command(list(dists), extra)
    if not runtime:
        verdict.cause, verdict.fix = "ONNX Runtime cannot be imported", install_command(extra)
    elif spec.removed_in and _version(runtime) >= _parse_version(spec.removed_in):
        verdict.cause = (f"the {provider} was removed in ONNX Runtime {spec.removed_in}"
                         f"{f' ({spec.removed_note})' if spec.removed_note else ''}; this is {runtime['version']}")
        instead = ""
        if spec.replaced_by:
            other = providers.get(spec.replaced_by)
            instead = f"Use --target {other.device} ({install_command(other.package[1])}); "
        verdict.fix = (f"{instead}the {provider} exists only in {package} < {spec.removed_in} "
                       f"({install_command(extra)}).")
    elif not built:
        have = ", ".join(f"{k} {v}" for k, v in dists.items()) or "no onnxruntime"
        verdict.cause = f"{provider} is not part of the installed ONNX Runtime ({have})"
        verdict.fix = f"It comes with {package}: {swap}"
    else:
        probe = probe_target(parse_target(label))
        verdict.ready, verdict.details = probe.loaded, probe.details
        if not probe.loaded:
            verdict.cause = probe.cause
            verdict.fix = probe.fix or f"Run with --debug to see the runtime's log; reinstall {package}."
    _hardware_checks(verdict, spec, nvidia, amd)
    return verdict


def _hardware_checks(verdict: TargetVerdict, spec: ProviderSpec, nvidia: NvidiaInventory, amd: AmdInventory) -> None:
    """The provider's doctor checks (ProviderSpec.doctor_checks): its vendor's GPUs, their architectures."""
    device = spec.device
    if "gpu" in spec.doctor_checks and spec.vendor == "nvidia" and not nvidia.gpus:
        verdict.warnings.append("no NVIDIA GPU found: " + ("; ".join(nvidia.notes) or "none listed"))
    if "gpu" in spec.doctor_checks and spec.vendor == "amd":
        if not amd.gpus and amd.problem is not None:
            verdict.warnings.append(f"{amd.problem.summary}; fix: see finding {amd.problem.code}")
        elif not amd.gpus:
            verdict.warnings.append("no AMD GPU found: " + ("; ".join(amd.notes) or "none listed"))
    if "gfx" in spec.doctor_checks:
        override = os.environ.get("HSA_OVERRIDE_GFX_VERSION")
        for gpu in amd.gpus:
            if not gpu.gfx:
                continue
            finding = check_gfx(gpu.gfx, device=device, override=override)
            if finding.severity in (WARN, ERROR):
                verdict.warnings.append(f"GPU {gpu.index}: {finding.title}. {finding.fix}")
            if finding.severity == ERROR and verdict.ready:
                verdict.ready, verdict.cause, verdict.fix = False, finding.title, finding.fix


def _version(runtime: dict):
    return _parse_version(str(runtime.get("version", "0")).split("+")[0])


def _parse_version(text: str):
    from packaging.version import Version

    return Version(text)
