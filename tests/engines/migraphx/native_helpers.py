"""Helpers for the native MIGraphX engine's tests (imported by name; conftest.py holds the fixtures).

NOT EXECUTED ON AMD HARDWARE: see conftest.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from onnxaccel.target import Target

HERE = Path(__file__).resolve().parent
FAKE_DIR = HERE / "fake_migraphx"
PLACEHOLDER_DIR = HERE / "fake_placeholder"


def native(precision: str = "fp32", device_id: int | None = None, **options) -> Target:
    """A ``migraphx@migraphx`` target. Built directly, not parsed: target.py does not yet accept the native
    engine's option keys (offload_copy, fast_math, ...); the engine validates them itself."""
    return Target(device="migraphx", device_id=device_id, precision=precision, engine="migraphx",
                  options=tuple(sorted((k, str(v)) for k, v in options.items())))


def use_module(monkeypatch, folder: Path):
    """Make `import migraphx` find the package in ``folder`` (fresh import, undone after the test)."""
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "migraphx", raising=False)
    import migraphx

    monkeypatch.setitem(sys.modules, "migraphx", migraphx)
    return migraphx


def calls(module) -> list[str]:
    return [name for name, _ in module._calls]


def ort_reference(path: Path, feeds: dict) -> dict:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def subprocess_env(tmp_path: Path, *, fake: bool = True) -> dict:
    """Environment for a CLI subprocess: the stand-in on PYTHONPATH (or not), its own cache."""
    env = {**os.environ, "COLUMNS": "200", "ONNXACCEL_CACHE_DIR": str(tmp_path / "cache")}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(([str(FAKE_DIR)] if fake else []) + paths)
    return env
