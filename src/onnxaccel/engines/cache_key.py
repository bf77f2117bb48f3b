"""The key of every compile cache: ONNX Runtime's EP caches (transform/compile_cache.py) and the native
MIGraphX engine's ``.mxr`` programs (engines/migraphx_cache.py).

A compiled program depends on the model's content, the target (precision and options, minus the ones that
only say where to cache), the input shapes, the runtime that built it (versions, build), the hardware it was
built for and, for INT8 programs the engine calibrates itself, the calibration data. One entry per key:
``<root>/<kind>-<digest>`` where the digest is the first 20 hex digits of the SHA-256 of :meth:`to_dict`
as sorted JSON, so any field that changes gives a new entry and a program is never loaded by a runtime that
did not build it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from onnxaccel import providers
from onnxaccel.engines.runtime_info import host_id, runtime_versions
from onnxaccel.model import Model, content_hash
from onnxaccel.paths import cache_root
from onnxaccel.target import Target


def compile_cache_dir() -> Path:
    """The default folder of every compile-cache entry: ``<cache_root>/compile``."""
    return cache_root() / "compile"


@dataclass(frozen=True)
class CompileKey:
    """What one compiled program was built from; ``kind`` names the cache (``ort-optimized``, ``migraphx``,
    ``tensorrt``, ``migraphx-native``)."""

    kind: str
    model: str
    model_sha256: str
    target: str
    precision: str
    shapes: dict[str, list[int]]
    runtime: dict[str, str]
    host: str
    #: Fingerprint of the INT8 calibration data the engine calibrates with (native MIGraphX); None otherwise.
    calibration: str | None = None

    @property
    def digest(self) -> str:
        """20 hex digits of the SHA-256 of :meth:`to_dict` as sorted JSON: the entry's name after the kind."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:20]

    @property
    def name(self) -> str:
        """The entry's folder name, ``<kind>-<digest>``."""
        return f"{self.kind}-{self.digest}"

    @property
    def entry(self) -> Path:
        """The entry's folder under the default cache root (:func:`compile_cache_dir`)."""
        return compile_cache_dir() / self.name

    def to_dict(self) -> dict:
        """The key as JSON-ready values, as ``key.json`` records it. ``calibration`` appears only when set, so
        a key without one digests the same as the EP caches' keys always have."""
        found = {"kind": self.kind, "model": self.model, "model_sha256": self.model_sha256, "target": self.target,
                 "precision": self.precision, "shapes": self.shapes, "runtime": self.runtime, "host": self.host}
        if self.calibration is not None:
            found["calibration"] = self.calibration
        return found


def compile_key(kind: str, model: Model, target: Target, shapes: Mapping[str, Sequence[int]], *,
                runtime: Mapping[str, str], host: str, not_keyed: Iterable[str] = (),
                calibration: str | None = None) -> CompileKey:
    """The key for compiling ``model`` at ``shapes`` for ``target``, leaving out the target options in
    ``not_keyed`` (those that say where or whether to cache, not how the program is built)."""
    skip = set(not_keyed)
    options = tuple((k, v) for k, v in target.options if k not in skip)
    return CompileKey(
        kind=kind, model=model.source, model_sha256=content_hash(model.path),
        target=str(dataclasses.replace(target, options=options)), precision=target.precision,
        shapes={k: [d if isinstance(d, str) else int(d) for d in v] for k, v in sorted(shapes.items())},
        runtime=dict(sorted(runtime.items())), host=host, calibration=calibration,
    )


def cache_options() -> frozenset[str]:
    """Options that only point at caches (every registered provider's cache options, and the optimizer level a
    cached, already optimized model is loaded with), or at a stream of this process (a provider's stream_option:
    an address, new at every start); they are not part of what a program was compiled from."""
    return frozenset({"graph_optimization_level"}.union(
        *(s.compile_cache.options for s in providers.all_specs() if s.compile_cache),
        (s.stream_option for s in providers.all_specs() if s.stream_option)))


def cache_kind(target: Target) -> str | None:
    """Which cache a target uses (its provider spec's compile_cache), or None when there is none (native
    MIGraphX engine, ROCm EP)."""
    if target.engine != "ort":
        return None
    cache = providers.get(target.device).compile_cache
    return cache.kind if cache else None


def cache_key(model: Model, target: Target, *, runtime: dict[str, str] | None = None, host: str | None = None
              ) -> CompileKey:
    """The key for compiling ``model`` (bound) for ``target`` through its provider's cache.

    ``runtime`` and ``host`` default to what is installed here (:func:`runtime_versions`, :func:`host_id`);
    passing them explicitly is how a caller (or a test) asks what the key would be under another runtime.
    """
    kind = cache_kind(target)
    if kind is None:
        raise ValueError(f"{target} has no compile cache")
    if not model.is_bound:
        model = model.bind()
    return compile_key(kind, model, target, model.input_shapes,
                       runtime=runtime if runtime is not None else runtime_versions(target),
                       host=host if host is not None else host_id(target), not_keyed=cache_options())
