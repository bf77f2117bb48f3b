"""What is known about a model file as long as it is unchanged: its sha256 (cache keys) and that onnx's checker
passed it, kept across processes so a second start reads neither again.

Reading a ResNet-50 (98 MB) for a run took 0.45-0.6 s of the start on the CPU here: the parse itself, onnx's checker
reading and checking the file again (0.16-0.23 s) and the sha256 that keys every cached variant and compile cache
(another parse and a hash of every byte, 0.16-0.21 s). Both of the last two depend on the bytes only, so they are
kept in ``<cache root>/model-facts/`` per file, keyed as make and pip's cache key files: by path, size, mtime
(nanoseconds) and inode of the model file and of each external data file it names; any change to one of them
and the facts are worked out again. The checker's verdict also records the onnx version that gave it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from onnxaccel.paths import cache_root

SCHEMA = "onnxaccel.model-facts/1"


def _stat(path: Path) -> list:
    st = path.stat()
    return [str(path), st.st_size, st.st_mtime_ns, st.st_ino]


def _entry(path: Path) -> Path:
    return cache_root() / "model-facts" / f"{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]}.json"


def facts(path: Path) -> dict:
    """The facts kept for ``path`` while it and its data files are unchanged ({} when none are, or stale)."""
    try:
        found = json.loads(_entry(path).read_text())
        if found.get("schema") != SCHEMA or found.get("files", [None])[0] != _stat(path.resolve()):
            return {}
        if any(_stat(Path(f[0])) != f for f in found["files"][1:]):
            return {}
        return found
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        return {}


def remember(path: Path, data_files: list[Path] | None = None, **known) -> None:
    """Keep ``known`` facts of ``path`` (and name its external ``data_files``, whose changes make them stale).
    The facts already kept for the same file stay. Unwritable caches are ignored: the facts are only a shortcut."""
    path = path.resolve()
    kept = facts(path)
    files = kept.get("files") or [_stat(path), *(_stat(f.resolve()) for f in data_files or [])]
    entry = _entry(path)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        temporary = entry.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({**kept, **known, "schema": SCHEMA, "files": files}))
        os.replace(temporary, entry)
    except OSError:
        pass
