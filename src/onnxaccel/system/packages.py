"""The installed ONNX Runtime: which distributions claim the ``onnxruntime`` module, and whose files it has.

onnxruntime, onnxruntime-gpu, onnxruntime-migraphx and onnxruntime-rocm all install the same
``onnxruntime/`` directory; with two installed, the second overwrote the first's files, and uninstalling
either deletes files the other needs. Which one really is there is read without importing it from
``onnxruntime/capi/build_and_package_info.py`` (``package_name = '...'``, and ``cuda_version`` in GPU wheels),
and each distribution's RECORD says whether its own copies of a few small files are still on disk.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

from onnxaccel.install import install_command
from onnxaccel.engines.ort import ORT_DISTRIBUTIONS, installed_distributions
from onnxaccel.system.findings import ERROR, OK, WARN, Finding

#: Small files every onnxruntime wheel ships; their hashes in RECORD differ between distributions.
_PROBE_FILES = ("onnxruntime/capi/build_and_package_info.py", "onnxruntime/__init__.py")


@dataclass
class OrtInstall:
    """Which ONNX Runtime distributions are installed and which one's files are on disk (the build
    that imports), with the CUDA version it was built against."""
    distributions: dict[str, str]
    module_path: str | None = None
    #: The distribution whose build is on disk, from build_and_package_info.py (canonical name).
    module_package: str | None = None
    module_version: str | None = None
    #: CUDA version a GPU build was compiled against, e.g. "13.0".
    cuda_version: str | None = None
    #: Distributions whose RECORD no longer matches the files on disk (overwritten by another).
    overwritten: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The install as JSON-ready values."""
        return dict(self.__dict__)


def inspect_ort_install() -> OrtInstall:
    """Read the installed ONNX Runtime distributions and the on-disk build's package info, without
    importing onnxruntime."""
    install = OrtInstall(installed_distributions())
    spec = importlib.util.find_spec("onnxruntime")  # finds, does not import
    if spec is None or not spec.submodule_search_locations:
        return install
    package_dir = Path(list(spec.submodule_search_locations)[0])
    install.module_path = str(package_dir)
    info = package_dir / "capi" / "build_and_package_info.py"
    if info.is_file():
        text = info.read_text(errors="replace")
        install.module_package = _assigned(text, "package_name")
        if install.module_package:
            install.module_package = str(canonicalize_name(install.module_package))
        install.module_version = _assigned(text, "__version__")
        install.cuda_version = _assigned(text, "cuda_version")
    site = package_dir.parent
    install.overwritten = [name for name in install.distributions if not _record_matches(name, site)]
    return install


def _assigned(text: str, name: str) -> str | None:
    found = re.search(rf"^{name}\s*=\s*['\"]([^'\"]*)['\"]", text, re.M)
    return found.group(1) if found else None


def _record_matches(distribution: str, site: Path) -> bool:
    """True when the probe files on disk have the hashes this distribution's RECORD gives them."""
    try:
        files = metadata.distribution(distribution).files or []
    except metadata.PackageNotFoundError:
        return True
    for entry in files:
        if str(entry).replace("\\", "/") not in _PROBE_FILES or entry.hash is None:
            continue
        path = site / str(entry)
        if not path.is_file():
            return False
        digest = hashlib.new(entry.hash.mode, path.read_bytes()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != entry.hash.value:
            return False
    return True


def preferred_distribution(vendor: str | None) -> str:
    """The onnxruntime distribution to keep for the GPU present ('nvidia', 'amd' or None)."""
    if vendor == "nvidia":
        return "onnxruntime-gpu"
    if vendor == "amd":
        # The ROCm EP ends with 1.22 (microsoft/onnxruntime#25181); MIGraphX is AMD's supported path.
        return "onnxruntime-migraphx"
    return "onnxruntime"


def package_findings(install: OrtInstall, vendor: str | None) -> list[Finding]:
    """Findings about the ONNX Runtime install for a machine with ``vendor``'s GPUs: none installed, several
    distributions overwriting one module, a module on disk from another build than the one installed; each
    with its fix."""
    dists = install.distributions
    if not dists:
        extra = {"nvidia": "cuda", "amd": "migraphx"}.get(vendor or "", "cpu")
        return [Finding(ERROR, "ort-missing", "No ONNX Runtime is installed",
                        "onnxaccel runs models with ONNX Runtime (or native MIGraphX).",
                        install_command(extra))]
    findings = []
    reinstall = ""
    listed = ", ".join(f"{k} {v}" for k, v in dists.items())
    if len(dists) > 1:
        keep = preferred_distribution(vendor)
        keep = keep if keep in dists else (install.module_package if install.module_package in dists else next(iter(dists)))
        drop = [d for d in dists if d != keep]
        why = {"nvidia": "an NVIDIA GPU is present", "amd": "an AMD GPU is present"}.get(vendor or "", "no GPU was found")
        reinstall = f"pip uninstall -y {' '.join(dists)} && pip install {keep}=={dists[keep]}"
        findings.append(Finding(
            ERROR, "ort-conflict", f"{len(dists)} ONNX Runtime distributions are installed: {listed}",
            "They all install the same `onnxruntime` module and overwrite one another's files; uninstalling one "
            "deletes files the other needs.",
            f"Keep {keep} ({why}), uninstall {', '.join(drop)}: {reinstall}",
        ))
    else:
        findings.append(Finding(OK, "ort-installed", f"ONNX Runtime: {listed}"))
    owner = install.module_package
    if owner and owner not in {str(canonicalize_name(d)) for d in dists}:
        findings.append(Finding(ERROR, "ort-module-orphaned", f"The onnxruntime module on disk is a {owner} build, "
                                f"but {owner} is not installed ({listed} is)", "Its files were left behind by "
                                "an uninstall or overwritten in place.",
                                f"pip uninstall -y {' '.join(dists)}; delete {install.module_path}; reinstall one."))
    mixed = [d for d in install.overwritten if d != owner]
    if mixed and owner:
        findings.append(Finding(ERROR if len(dists) > 1 else WARN, "ort-module-mixed",
                                f"The onnxruntime module's files belong to {owner}, not to {', '.join(mixed)}",
                                f"{', '.join(mixed)}'s RECORD no longer matches the files on disk: "
                                f"they were overwritten by {owner}.",
                                reinstall or (f"pip install --force-reinstall --no-deps {owner}=={dists[owner]}"
                                              if owner in dists else "Reinstall the one distribution you want.")))
    return findings


__all__ = ["ORT_DISTRIBUTIONS", "OrtInstall", "inspect_ort_install", "package_findings", "preferred_distribution"]
