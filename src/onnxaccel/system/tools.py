"""Find and run the vendors' command-line tools (rocminfo, rocm-smi, amd-smi, nvidia-smi).

ROCm installs its tools in ``$ROCM_PATH/bin`` (default ``/opt/rocm/bin``), which is often not on PATH, so a
tool is looked up on PATH first and then there. A tool that hangs (a wedged driver does that) is cut off
after ``timeout`` seconds; a failure is returned, never raised.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def rocm_root() -> Path:
    """``$ROCM_PATH`` (ROCm's own variable), else ``/opt/rocm``."""
    return Path(os.environ.get("ROCM_PATH") or "/opt/rocm")


def find_tool(name: str) -> str | None:
    """The path of a command-line tool: on PATH, else in ROCm's ``bin`` folder; None when neither has it."""
    found = shutil.which(name)
    if found:
        return found
    candidate = rocm_root() / "bin" / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


@dataclass(frozen=True)
class ToolRun:
    """What running a tool gave: its output, exit status, why it could not run, and its CPU time."""
    argv: tuple[str, ...]
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    #: Why the tool could not run at all (not found, timed out, not executable); None when it ran.
    error: str | None = None
    #: CPU seconds the tool's process used (user + system), from getrusage(RUSAGE_CHILDREN).
    child_cpu_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the tool ran and exited 0."""
        return self.error is None and self.returncode == 0


def run_tool(argv: Sequence[str], *, timeout: float = 10.0) -> ToolRun:
    """Run ``argv``; ``argv[0]`` may be a bare name (looked up with :func:`find_tool`) or a path."""
    argv = tuple(str(a) for a in argv)
    exe = argv[0] if os.sep in argv[0] else find_tool(argv[0])
    if exe is None:
        return ToolRun(argv, error=f"{argv[0]} not found (looked on PATH and in {rocm_root() / 'bin'})")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run((exe, *argv[1:]), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, errors="replace")
    except subprocess.TimeoutExpired:
        return ToolRun(argv, error=f"{argv[0]} did not answer within {timeout:g} s")
    except OSError as exc:
        return ToolRun(argv, error=f"{argv[0]} could not be run: {exc.strerror or exc}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return ToolRun(argv, done.stdout, done.stderr, done.returncode, child_cpu_s=max(cpu, 0.0))
