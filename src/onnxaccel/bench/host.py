"""The machine a report was measured on, and this process's memory.

Host memory comes from ``/proc/self/status`` (Linux: VmRSS = resident now, VmHWM = peak resident since the
process started; proc(5)); elsewhere from ``resource.getrusage`` (ru_maxrss: KiB on Linux, bytes on macOS).
"""

from __future__ import annotations

import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from onnxaccel import __version__
from onnxaccel.engines.ort import import_ort, installed_distributions


def utc_now() -> str:
    """The current UTC time as ISO 8601 text to the second, for report timestamps."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def host_memory() -> dict:
    """{"rss_bytes": now, "peak_rss_bytes": process peak so far} (None where unknown)."""
    status = Path("/proc/self/status")
    if status.exists():
        values = {}
        for line in status.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024  # the file says "kB" (KiB)
        return {"rss_bytes": values.get("VmRSS"), "peak_rss_bytes": values.get("VmHWM")}
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"rss_bytes": None, "peak_rss_bytes": peak if sys.platform == "darwin" else peak * 1024}
    except (ImportError, OSError):
        return {"rss_bytes": None, "peak_rss_bytes": None}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def environment() -> dict:
    """Versions and hardware that decide what a figure means."""
    info = {
        "onnxaccel": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "onnxruntime": None,
        "onnxruntime_distributions": {},
    }
    try:
        info["onnxruntime"] = import_ort().__version__
        info["onnxruntime_distributions"] = installed_distributions()
    except Exception as exc:  # noqa: BLE001 - a missing runtime is reported by the cells themselves
        info["onnxruntime_error"] = f"{type(exc).__name__}: {exc}"
    return info
