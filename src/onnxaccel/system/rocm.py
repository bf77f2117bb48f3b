"""The ROCm installation: its release, the HIP runtime and MIGraphX libraries it has, other releases beside it.

onnxruntime-migraphx >= 1.23 and onnxruntime-rocm 1.22 link ``libamdhip64.so.7`` (ROCm 7.x) and, for MIGraphX,
``libmigraphx_c.so.3``; their RUNPATH is ``/opt/rocm-7.2.4/lib:/opt/rocm/lib`` (read with readelf -d from
libonnxruntime_providers_migraphx.so 1.27.1 and libonnxruntime_providers_rocm.so 1.22.2). A ROCm 6 install (HIP
soname 6) cannot satisfy them, and two releases on one search path mix libraries, the usual cause of
``HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENT``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from onnxaccel.system.findings import ERROR, INFO, OK, WARN, Finding
from onnxaccel.system.tools import rocm_root

#: The HIP soname major the PyPI AMD wheels link against (NEEDED libamdhip64.so.7 in their provider libraries).
WHEEL_HIP_SONAME = "7"


@dataclass
class RocmInstall:
    """A ROCm install as found on disk: its root, release, HIP and MIGraphX libraries, other releases."""
    root: str
    exists: bool
    #: From ``<root>/.info/version`` (written by the rocm-core package), e.g. "7.0.2-56".
    version: str | None = None
    hip_sonames: list[str] = field(default_factory=list)
    migraphx_c: str | None = None
    #: Every ``/opt/rocm-X.Y.Z`` beside the root.
    releases: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The install as JSON-ready values."""
        return dict(self.__dict__)


def inspect_rocm(root: Path | None = None) -> RocmInstall:
    """Read the ROCm install at ``root`` (default: $ROCM_PATH or /opt/rocm) from its files only."""
    root = root or rocm_root()
    install = RocmInstall(str(root), root.is_dir())
    if install.exists:
        info = root / ".info" / "version"
        if info.is_file():
            install.version = info.read_text(errors="replace").strip() or None
        for lib_dir in (root / "lib", root / "lib64"):
            if lib_dir.is_dir():
                for lib in lib_dir.glob("libamdhip64.so.*"):
                    soname = lib.name.split(".so.", 1)[1].split(".")[0]
                    if soname not in install.hip_sonames:
                        install.hip_sonames.append(soname)
                migraphx = sorted(lib_dir.glob("libmigraphx_c.so.3*"))
                if migraphx and install.migraphx_c is None:
                    install.migraphx_c = migraphx[-1].name
    parent = root.resolve().parent if install.exists else root.parent
    install.releases = sorted(p.name for p in parent.glob("rocm-*") if p.is_dir())
    install.hip_sonames.sort()
    return install


def rocm_findings(install: RocmInstall, wheels: dict[str, str], *, amd_gpu: bool) -> list[Finding]:
    """Check the install against the AMD onnxruntime wheels present (``{distribution: version}``)."""
    amd_wheels = {k: v for k, v in wheels.items() if k in ("onnxruntime-migraphx", "onnxruntime-rocm")}
    findings = []
    if not install.exists:
        if amd_wheels or amd_gpu:
            findings.append(Finding(ERROR if amd_wheels else WARN, "rocm-missing", f"ROCm is not installed at {install.root}",
                                    f"{', '.join(amd_wheels) or 'An AMD GPU'} needs the ROCm 7.x runtime.",
                                    "Install ROCm 7.x from AMD's repositories (docs/AMD.md); set ROCM_PATH if it "
                                    "lives elsewhere."))
        return findings
    version = _release(install.version)
    findings.append(Finding(INFO, "rocm-version", f"ROCm {install.version or '(version unknown)'} at {install.root}",
                            f"HIP runtime sonames: {', '.join(install.hip_sonames) or 'none found'}; MIGraphX C "
                            f"library: {install.migraphx_c or 'not installed'}"))
    if len(install.releases) > 1:
        findings.append(Finding(WARN, "rocm-several-releases", f"Several ROCm releases are installed: "
                                f"{', '.join(install.releases)}", f"{install.root} resolves to "
                                f"{Path(install.root).resolve()}; a library path naming another release mixes them.",
                                "Keep one release, or make sure LD_LIBRARY_PATH and ldconfig name only the one "
                                f"{install.root} points to."))
    if amd_wheels and install.hip_sonames and WHEEL_HIP_SONAME not in install.hip_sonames:
        findings.append(Finding(ERROR, "rocm-hip-too-old", f"ROCm's HIP runtime is soname "
                                f"{'/'.join(install.hip_sonames)}, but {', '.join(amd_wheels)} needs "
                                f"libamdhip64.so.{WHEEL_HIP_SONAME} (ROCm 7.x)",
                                "The wheel's provider library will not load.", "Upgrade ROCm to 7.x."))
    elif amd_wheels and version is not None and version.major < 7:
        findings.append(Finding(ERROR, "rocm-hip-too-old", f"ROCm {install.version} is older than the 7.x the "
                                f"wheels ({', '.join(amd_wheels)}) were built for", "", "Upgrade ROCm to 7.x."))
    if "onnxruntime-migraphx" in amd_wheels and install.migraphx_c is None:
        findings.append(Finding(ERROR, "migraphx-missing", f"MIGraphX is not installed in {install.root}",
                                "onnxruntime-migraphx loads libmigraphx_c.so.3 from ROCm.",
                                "apt install migraphx (from the same ROCm release), see docs/AMD.md."))
    elif "onnxruntime-migraphx" in amd_wheels and findings[-1].severity == INFO:
        findings.append(Finding(OK, "rocm-consistent", "ROCm has what onnxruntime-migraphx links "
                                f"(libamdhip64.so.{WHEEL_HIP_SONAME}, {install.migraphx_c})"))
    return findings


def _release(text: str | None) -> Version | None:
    found = re.match(r"(\d+(?:\.\d+)*)", text or "")
    try:
        return Version(found.group(1)) if found else None
    except InvalidVersion:
        return None
