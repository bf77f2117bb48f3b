"""Where onnxaccel keeps files: one cache root for zoo models, converted models and compile caches."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

CACHE_ENV = "ONNXACCEL_CACHE_DIR"
#: A directory written by ``onnxaccel compile -o DIR``: every command builds its sessions from it, read-only, and
#: refuses to start when it lacks what the command needs or was made elsewhere (engines/artifacts.py).
ARTIFACTS_ENV = "ONNXACCEL_ARTIFACTS"


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


#: Every compile-cache entry (ORT-optimized graphs, MIGraphX .mxr programs, TensorRT engines) is a folder
#: holding its artefact and this file: what the entry is keyed by, and its cold/warm times.
KEY_FILE = "key.json"
KEY_SCHEMA = "onnxaccel.compile-cache/1"


def record_cache_use(entry: Path, key: dict, *, seconds: float, hit: bool) -> dict:
    """Update an entry's key.json: first-compile time on a miss, warm-start time and hit count on a hit.
    Written atomically (temp file + rename) so a reader never sees half a record."""
    entry.mkdir(parents=True, exist_ok=True)
    path = entry / KEY_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {"schema": KEY_SCHEMA, "key": key, "created": time.time(), "hits": 0}
    record["last_used"] = time.time()
    if hit:
        record["hits"] = int(record.get("hits", 0)) + 1
        record["warm_start_seconds"] = seconds
    else:
        record["first_compile_seconds"] = seconds
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return record
