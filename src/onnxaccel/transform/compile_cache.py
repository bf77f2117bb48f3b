"""Compile caches keyed by model content + target + precision + shapes + runtime versions + host.

What is cached, per kind of target:

* ``ort-optimized`` (cpu, cuda): the graph ONNX Runtime optimized for this provider, saved with
  ``SessionOptions.optimized_model_filepath``; a warm start loads it with graph optimization disabled, so
  session creation skips the optimizer (ORT docs, "Graph Optimizations": online vs offline mode).
* ``migraphx`` (MIGraphX EP): the directory given as ``migraphx_model_cache_dir``, where the provider saves
  one compiled program per input shape as ``<hash>.mxr`` (msgpack) and loads it on the next session
  instead of compiling (microsoft/onnxruntime onnxruntime/core/providers/migraphx/
  migraphx_execution_provider.cc at 03c1250; its log: "Model Compile: Begin"... "load model : Success").
* ``tensorrt`` (TensorRT EP): ``trt_engine_cache_path`` and ``trt_timing_cache_path``.

Each entry is a folder ``<cache_root>/compile/<kind>-<digest>`` with ``key.json`` (what it is keyed by,
first-compile and warm-start seconds, hits); the key is :class:`~onnxaccel.engines.cache_key.CompileKey`, the
one the native MIGraphX engine's ``.mxr`` cache uses too. The digest covers every key field, so a new ONNX Runtime,
MIGraphX, ROCm, TensorRT or driver version, another GPU, another shape or precision, or an edited model
gives a new entry: old programs are never loaded by a runtime that did not build them. ``cache list``
marks entries built by other runtime versions as stale; ``cache clear --stale`` removes them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

# The key (cache_key, cache_kind, the options that only point at caches) lives in engines/cache_key.py, below
# the pipeline, which keys the artifacts it loads (engines/artifacts.py) by it too; imported here for callers.
from onnxaccel.engines.cache_key import CompileKey, cache_key, cache_kind, compile_cache_dir
from onnxaccel.engines.cache_key import cache_options as _cache_options
from onnxaccel.engines.runtime_info import runtime_versions
from onnxaccel.model import Model
from onnxaccel.paths import KEY_FILE, record_cache_use
from onnxaccel.target import Target, parse_target

@dataclass
class CacheEntry:
    """One cache folder as ``cache list`` shows it."""

    path: Path
    key: dict
    size_bytes: int
    files: int
    created: float | None = None
    last_used: float | None = None
    first_compile_seconds: float | None = None
    warm_start_seconds: float | None = None
    hits: int = 0
    stale: bool = False
    problem: str | None = None

    @property
    def name(self) -> str:
        """The entry's folder name, ``<kind>-<digest>``."""
        return self.path.name

    def to_dict(self) -> dict:
        """The entry as JSON-ready values, as ``cache list --json`` prints it."""
        return {"name": self.name, "path": str(self.path), "key": self.key, "size_bytes": self.size_bytes,
                "files": self.files, "created": self.created, "last_used": self.last_used,
                "first_compile_seconds": self.first_compile_seconds, "warm_start_seconds": self.warm_start_seconds,
                "hits": self.hits, "stale": self.stale, "problem": self.problem}


def read_entry(path: Path) -> CacheEntry:
    """One cache folder read back: its key, size, times and hits; an unreadable ``key.json`` gives an
    entry with ``problem`` set instead of raising, so ``cache list`` still shows it."""
    files = [p for p in path.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    try:
        record = json.loads((path / KEY_FILE).read_text())
        key = record["key"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return CacheEntry(path, {}, size, len(files), problem=f"unreadable {KEY_FILE}: {exc}")
    entry = CacheEntry(path, key, size, len(files), created=record.get("created"), last_used=record.get("last_used"),
                       first_compile_seconds=record.get("first_compile_seconds"),
                       warm_start_seconds=record.get("warm_start_seconds"), hits=int(record.get("hits", 0)))
    entry.stale = _is_stale(key)
    return entry


def list_entries() -> list[CacheEntry]:
    """Every entry under the compile cache, most recently used first."""
    root = compile_cache_dir()
    if not root.is_dir():
        return []
    return sorted((read_entry(p) for p in root.iterdir() if p.is_dir()), key=lambda e: e.last_used or 0, reverse=True)


def remove_entries(entries: list[CacheEntry]) -> int:
    """Delete the given entries; return the bytes freed."""
    freed = 0
    for entry in entries:
        freed += entry.size_bytes
        shutil.rmtree(entry.path, ignore_errors=True)
    return freed


def record_compile(key: CompileKey, *, seconds: float, hit: bool) -> dict:
    """Update ``key.json`` after a compile: first-compile time on a miss, warm-start time on a hit."""
    return record_cache_use(key.entry, key.to_dict(), seconds=seconds, hit=hit)


def _is_stale(key: dict) -> bool:
    """True when the entry was built by other runtime versions than the ones installed here."""
    try:
        target = parse_target(key["target"])
        return dict(key.get("runtime", {})) != runtime_versions(target)
    except Exception:  # noqa: BLE001 - an entry we cannot even parse is stale
        return True


@dataclass
class CacheUse:
    """How a compile used the cache: the key, whether it hit, and the time the session took."""

    key: CompileKey | None
    hit: bool
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: Why the model was compiled without the cache although its target has one (cached_compile._uncacheable).
    uncached: str | None = None

    def to_dict(self) -> dict:
        """The use as JSON-ready values: the entry folder, digest, hit, seconds, key, notes and ``uncached``."""
        key = self.key
        return {"entry": str(key.entry) if key else None, "digest": key.digest if key else None, "hit": self.hit,
                "seconds": self.seconds, "key": key.to_dict() if key else None, "notes": self.notes,
                "uncached": self.uncached}


def bucket_cache_keys(model: Model, target: Target, buckets, *, batch: int | None = None,
                      runtime: dict[str, str] | None = None, host: str | None = None) -> dict[str, CompileKey]:
    """Per shape bucket (engines/buckets.py ShapeBuckets), the key its program is cached under: each bucket's
    model is bound at the bucket's sizes, and the bound shapes are part of every key, so each bucket compiles
    once and is found again by its own entry."""
    from onnxaccel.engines.buckets import bucket_models  # engines below transform: no cycle
    return {buckets.label(b): cache_key(m, target, runtime=runtime, host=host)
            for b, m in bucket_models(model, buckets, batch=batch).items()}
