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


def throwaway_venv(packages: list[str], *, with_project: bool = True) -> Path:
    """A venv holding ``packages`` (and this project, core dependencies only); returns its python."""
    key = hashlib.sha256(json.dumps([sys.version, packages, with_project]).encode()).hexdigest()[:12]
    home = VENVS / key
    python = home / "bin" / "python"
    if (home / ".complete").exists():
        return python
    shutil.rmtree(home, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *packages], check=True, timeout=900)
    if with_project:
        # Core dependencies only: no extra, so the venv keeps exactly the onnxruntime build(s) asked for.
        subprocess.run([*pip, "-e", str(ROOT)], check=True, timeout=900)
    (home / ".complete").write_text(json.dumps(packages))
    return python


def run_cli(python: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-m", "onnxaccel.cli.main", *args], capture_output=True, text=True, timeout=600,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
