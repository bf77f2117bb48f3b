"""Where onnxaccel keeps files: one cache root for zoo models, converted models and compile caches."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "ONNXACCEL_CACHE_DIR"


def cache_root() -> Path:
    """$ONNXACCEL_CACHE_DIR, else the platform's user cache dir (~/.cache/onnxaccel on Linux)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("onnxaccel"))


def runtime_models_dir() -> Path:
    """Models rewritten for a runtime (IR lowered, FP16-converted), keyed by their source file."""
    path = cache_root() / "runtime-models"
    path.mkdir(parents=True, exist_ok=True)
    return path
