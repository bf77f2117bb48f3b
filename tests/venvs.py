"""Throwaway virtual environments with real packages from PyPI, for tests that need another
onnxruntime build than the one installed (onnxruntime-migraphx, onnxruntime-rocm, two builds at once).

Each venv is cached under .pytest_cache/venvs/<digest of its package list>, so a second test run reuses it;
CI starts from a clean clone and builds them once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / ".pytest_cache" / "venvs"


def throwaway_venv(packages: list[str], *, with_project: bool = True, extras: str = "") -> Path:
    """A venv holding ``packages`` (and this project, core dependencies only, plus ``extras`` such as "cpu");
    returns its python. With ``extras`` the cache is keyed on pyproject.toml too, so a changed dependency list
    builds a new venv."""
    project = (ROOT / "pyproject.toml").read_text() if extras else ""
    key = hashlib.sha256(json.dumps([sys.version, packages, with_project, extras, project]).encode()).hexdigest()[:12]
    home = VENVS / key
    python = home / "bin" / "python"
    if (home / ".complete").exists():
        return python
    shutil.rmtree(home, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if packages:
        subprocess.run([*pip, *packages], check=True, timeout=900)
    if with_project:
        # Core dependencies only (and the extras asked for), so the venv keeps exactly the onnxruntime build(s)
        # asked for.
        subprocess.run([*pip, "-e", f"{ROOT}[{extras}]" if extras else str(ROOT)], check=True, timeout=900)
    (home / ".complete").write_text(json.dumps(packages))
    return python


def run_cli(python: Path, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m onnxaccel.cli.main ARGS`` in that venv, wide output, captured."""
    return subprocess.run(
        [str(python), "-m", "onnxaccel.cli.main", *args], capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "200", **(env or {})}, cwd=cwd,
    )
