"""Why AMD's tools see no GPU: what they print, translated into what is wrong and how to fix it.

rocminfo and rocm-smi check the amdgpu kernel driver before they query anything, and their answers are
easy to miss: rocminfo prints in red on stdout (stderr carries only the noise of the commands it runs),
and rocm-smi logs to stderr and exits 0 with an empty stdout. Each message is matched here and turned into an
:class:`AmdProblem` with a stable code (a doctor finding, docs/TROUBLESHOOTING.md) and a fix.

Executed here. This project's CI machine has no AMD GPU and no amdgpu module, and it has Debian's rocminfo,
rocm-smi and libamdhip64-5 (all ROCm 5.2.3). rocminfo prints "ROCk module is NOT loaded, possibly no GPU
devices" and exits 1. ``rocm-smi --json`` logs "ERROR:root:Driver not initialized (amdgpu not found in
modules)" and exits 0. Every other message in the tables was read in the tools' source but never printed here,
because each one needs an amdgpu module that is loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The first step of every fix for a driver that is missing.
DRIVER_FIX = ("Install and load the amdgpu kernel driver: AMD's amdgpu-dkms package (docs/AMD.md) or the "
              "kernel's own module (sudo modprobe amdgpu). Then check that /dev/kfd exists and that you are in "
              "the group that owns it (render or video). In a container, start it with --device=/dev/kfd "
              "--device=/dev/dri.")
GROUP_FIX = ("Add your user to the group that owns /dev/kfd and /dev/dri/renderD* (sudo usermod -a -G "
             "render,video $LOGNAME), then log in again. In a container, pass --device=/dev/kfd --device=/dev/dri "
             "and --group-add for those groups.")


@dataclass(frozen=True)
class AmdProblem:
    """Why no AMD GPU is visible, in the tool's own words (``said``) and ours (``cause``, ``fix``)."""

    code: str
    cause: str
    said: str
    fix: str

    @property
    def summary(self) -> str:
        """What is wrong and who said so, without the fix (for lists where the fix is shown apart)."""
        return f"no AMD GPU visible: {self.cause} ({self.said})"

    def __str__(self) -> str:
        return f"{self.summary}. Fix: {self.fix}"

    def to_dict(self) -> dict:
        """The problem as JSON-ready values."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class _Message:
    """One message a tool prints. ``upstream`` is its text as the tool's source spells it (held against the
    vendored source in tests/system/upstream/); ``pattern`` matches the printed line."""

    upstream: str
    pattern: str
    code: str
    cause: str
    fix: str


# rocminfo.cc, CheckInitialState() and RET_IF_HSA_ERR: ROCm/rocminfo@cf92f649ab0db4084fc8b2b6e891670f60edc314
# (tag rocm-5.2.3, Debian's rocminfo 5.2.3, which runs here) and ROCm/rocminfo@c6f7a17c85e0cdd75bf062e7a3490e831c87eb94
# (master, 2024-09; it reads /sys/module/amdgpu/initstate and adds "NOT live"). Vendored: tests/system/upstream/
# rocminfo_*.txt. The most specific message comes first (rocminfo prints the group line after the /dev/kfd one).
ROCMINFO_MESSAGES = (
    _Message("ROCk module is NOT loaded, possibly no GPU devices", r"ROCk module is NOT loaded, possibly no GPU devices",
             "amd-driver-not-loaded", "the amdgpu kernel driver is not loaded", DRIVER_FIX),
    _Message("ROCk module is NOT live, possibly no GPU devices", r"ROCk module is NOT live, possibly no GPU devices",
             "amd-driver-not-live", "the amdgpu kernel driver is loaded but has not brought up a GPU",
             "Read why in the kernel log (sudo dmesg | grep -i amdgpu). The usual causes are missing firmware "
             "(install linux-firmware, or AMD's amdgpu-dkms-firmware with amdgpu-dkms) and a GPU that this "
             "kernel's amdgpu does not support (install amdgpu-dkms from AMD's repository). Then reboot."),
    _Message('is not member of \\"%s\\" group', r'(?P<user>\S+) is not member of "(?P<group>[^"]+)" group',
             "amd-not-in-gpu-group", "user {user} is not in the {group!r} group that owns /dev/kfd", GROUP_FIX),
    _Message("Unable to open /dev/kfd read-write: %s", r"Unable to open /dev/kfd read-write: (?P<why>.+)",
             "amd-kfd-no-access", "/dev/kfd cannot be opened read-write ({why})", GROUP_FIX),
    _Message("Call returned %s", r"Call returned (?P<status>\S+)", "amd-hsa-init-failed",
             "the HSA runtime failed to start ({status})",
             "Keep one ROCm release on the library path (see rocm-several-releases), and check that the kernel "
             "driver is recent enough for it (sudo dmesg | grep -i kfd)."),
)

# python_smi_tools/rocm_smi.py, initializeRsmi(): ROCm/rocm_smi_lib@e092ccc74c7bbc421ba3dbb91640df7d2058adf4
# (tag rocm-5.2.3, Debian's rocm-smi 5.2.3, which runs here) and @5ac86f6f5a0300815c76d2bb7e5f889ac3b72a7c (tag
# rocm-6.2.0). It logs through logging.error and exits 0 when the driver is missing. driverInitialized() greps
# /sys/module/amdgpu/initstate for "live", so this covers a module that is absent and one that is not live.
# Vendored: tests/system/upstream/rocm_smi_*.txt.
ROCM_SMI_MESSAGES = (
    _Message("Driver not initialized (amdgpu not found in modules)",
             r"Driver not initialized \(amdgpu not found in modules\)", "amd-driver-not-loaded",
             "the amdgpu kernel driver is not loaded or not initialized", DRIVER_FIX),
    _Message("ROCm SMI returned %s (the expected value is 0)", r"ROCm SMI returned (?P<status>\d+) \(the expected",
             "amd-smi-init-failed", "rocm_smi_lib failed to start (rsmi_init returned {status})",
             "Run rocm-smi by hand to see its whole output. Check that you can read /sys/class/drm and "
             "/dev/dri (render/video groups), and that librocm_smi64 comes from the installed ROCm release."),
)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(text: str) -> str:
    """``text`` without the ANSI colour codes rocminfo wraps its messages in."""
    return _ANSI.sub("", text or "")


def _explain(tool: str, messages: tuple[_Message, ...], *outputs: str) -> AmdProblem | None:
    lines = [line.strip() for output in outputs for line in plain(output).splitlines() if line.strip()]
    for message in messages:
        pattern = re.compile(message.pattern)
        for line in lines:
            found = pattern.search(line)
            if found:
                said = line.split("ERROR:root:", 1)[-1]
                return AmdProblem(message.code, message.cause.format(**found.groupdict()), f"{tool}: {said}",
                                  message.fix)
    return None


def explain_rocminfo(stdout: str, stderr: str = "") -> AmdProblem | None:
    """The problem rocminfo reported, or None (it listed agents, or said something not in the table)."""
    return _explain("rocminfo", ROCMINFO_MESSAGES, stdout, stderr)


def explain_rocm_smi(stdout: str, stderr: str = "") -> AmdProblem | None:
    """The problem rocm-smi reported (it exits 0 when the driver is missing), or None."""
    return _explain("rocm-smi", ROCM_SMI_MESSAGES, stdout, stderr)
