"""Sessions built from an artifacts directory (``onnxaccel compile -o DIR``), read-only: what a start loads
instead of compiling.

The one consumer is ``pipeline.RunnerFromVariant`` (every command builds its runners there): while a store is
active, from ``ONNXACCEL_ARTIFACTS`` or :func:`use`, it asks :meth:`ArtifactStore.runner` for each runner, keyed
by the bound model *before* precision conversion and the target asked, so a start from the directory neither
converts nor optimizes nor compiles. Per kind of target (engines/cache_key.py ``cache_kind``):

* ``ort-optimized`` (CPU, CUDA): the graph ONNX Runtime optimized for the provider, already at the target's
  precision, loaded with ``graph_optimization_level`` disabled (the optimizer does not run again).
* ``migraphx`` / ``tensorrt`` (EP caches): the provider's own folder of compiled programs (``.mxr`` per input
  shape) or engines, pointed at with the provider's cache options (its spec's ``compile_cache``). The MIGraphX
  EP loads a program whose file exists and saves one only after compiling it (microsoft/onnxruntime
  onnxruntime/core/providers/migraphx/migraphx_execution_provider.cc at 03c125006fc8, ``load_or_compile_model``:
  ``save_compiled_model`` runs only when ``load_precompiled_model`` found no file), so a directory holding every
  shape the start runs is not written to. A shape it does not hold would be compiled by the EP on first use:
  ``compile`` warms every padded batch size and bucket the plan runs for that reason.
* ``migraphx-native`` (``@migraphx``): the engine's ``.mxr`` programs under ``DIR/programs``, a program cache
  made read-only here (engines/migraphx_cache.py ``serve_read_only``): a program it lacks is an error.
* targets with nothing to keep (the ROCm EP): the converted variant when the precision needs one, else the model.

A key not in the directory raises :class:`~onnxaccel.errors.ArtifactMissingError`, one made under other
versions or hardware :class:`~onnxaccel.errors.ArtifactMismatchError` (engines/artifact_manifest.py); neither
is answered by compiling. With a ``builder`` (``onnxaccel compile``, transform/artifacts_build.py) the store is
writable instead: a key it lacks is made, saved and recorded, then loaded like the others; :meth:`commit` writes
the manifest. Counts of sessions, compiles and loads: engines/build_counts.py.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import onnx

from onnxaccel import providers
from onnxaccel.engines.artifact_manifest import MANIFEST, Artifact, Manifest, missing, read_manifest, write_manifest
from onnxaccel.engines.build_counts import count_session
from onnxaccel.engines.cache_key import cache_key, cache_kind, compile_key
from onnxaccel.engines.migraphx_cache import KIND as NATIVE_KIND
from onnxaccel.engines.migraphx_cache import PROGRAM_FILE, serve_read_only
from onnxaccel.errors import ArtifactError
from onnxaccel.model import Model, content_hash
from onnxaccel.paths import ARTIFACTS_ENV
from onnxaccel.target import Target

if TYPE_CHECKING:
    from onnxaccel.engines.base import Runner
    from onnxaccel.precision import PrecisionVariant

#: Where the native MIGraphX engine's programs live in the directory (a migraphx_cache.ProgramCache root).
PROGRAMS = "programs"
MODEL_FILE = "model.onnx"


class ArtifactBuilder(Protocol):
    """What a writable store needs to make artifacts (``onnxaccel compile``; transform/artifacts_build.py)."""

    def save_model(self, model: Model, path: Path, *, what: str) -> None:
        """Write ``model`` (weights included) to ``path``, fully checked."""

    def optimize(self, model: Model, target: Target, path: Path) -> str:
        """Write ONNX Runtime's graph of ``model`` optimized for ``target`` to ``path``; a note saying how."""


class ArtifactStore:
    """An artifacts directory: read-only without ``builder``; with one, what a start asks for and the directory
    lacks is made and recorded (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, *, builder: ArtifactBuilder | None = None):
        self.root = Path(directory).expanduser().resolve()
        self.builder = builder
        self._lock = threading.Lock()
        #: What this process made (writable store), in order: `compile`'s report.
        self.made: list[Artifact] = []
        if builder is not None and not (self.root / MANIFEST).is_file():
            if self.root.is_dir() and any(self.root.iterdir()):
                raise ArtifactError(f"{self.root} is not empty and is not an artifacts directory (no {MANIFEST}).",
                                    "Give `onnxaccel compile -o` a new or empty directory, or one it made.")
            self.root.mkdir(parents=True, exist_ok=True)
            self.manifest = Manifest()
        else:
            self.manifest = read_manifest(self.root)

    @property
    def writable(self) -> bool:
        """Whether a missing artifact is made (``onnxaccel compile``) rather than an error."""
        return self.builder is not None

    # -- lookups ----------------------------------------------------------------------------------------

    def find(self, key: dict) -> Artifact | None:
        """The artifact made under ``key``; None when a writable store lacks it. Read-only: an
        ArtifactMissingError when it lacks it; both: an ArtifactMismatchError when it was made elsewhere."""
        found = self.manifest.find(key)
        if found is None and not self.writable:
            raise missing(key, self.root, self.manifest)
        return found

    def path(self, artifact: Artifact) -> Path:
        """The artifact's first file (its model, or its folder for provider caches) in the directory."""
        return self.root / (artifact.files[0] if artifact.files else artifact.id)

    def embedded(self, source: Model, preset: str, make: Callable[[], str]) -> str:
        """The path of ``source`` with ``preset`` preprocessing embedded, from the directory; a writable store
        makes it with ``make()`` (transform/embed_preprocess.py embedded_copy) and keeps a checked copy."""
        key = {"kind": "embedded", "model": source.source, "model_sha256": content_hash(source.path),
               "preset": preset}
        with self._lock:
            found = self.find(key)
            if found is None:
                start = time.perf_counter()
                made = Path(make())
                found = self._save(key, _made_model(made), start, what=f"embedded {preset} preprocessing")
        return str(self.path(found))

    # -- runners ----------------------------------------------------------------------------------------

    def runner(self, model: Model, target: Target, *, strict: bool = False,
               variant: Callable[[], PrecisionVariant] | None = None) -> Runner:
        """A runner of ``model`` (bound, before conversion) on ``target`` from its artifact. ``variant``: the
        pipeline's converted model, made only when a writable store has to make the artifact."""
        bound = model if model.is_bound else model.bind()
        if target.engine == "migraphx":
            return self._native(bound, target, strict)
        kind = cache_kind(target)
        if kind is None:
            return self._uncached(bound, target, strict, variant)
        with self._lock:
            key = cache_key(bound, target).to_dict()
            found, made = self.find(key), False
            if found is None:
                found, made = self._make_session(kind, key, bound, target, variant), True
        engine_target = dataclasses.replace(target, precision="fp32") if found.converted else target
        if kind == "ort-optimized":
            path = self.path(found)
            run = dataclasses.replace(bound, path=path, proto=onnx.load(str(path), load_external_data=False),
                                      notes=tuple(bound.notes) + tuple(found.notes))
            engine_target = engine_target.with_options({"graph_optimization_level": "disable"})
        else:
            run = self._variant_model(found, bound)
            cache = providers.get(target.device).compile_cache
            engine_target = engine_target.with_options(cache.options_for(str(self.path(found))))
        return _compiled(run, engine_target, strict, loaded=not made)

    def _native(self, bound: Model, target: Target, strict: bool) -> Runner:
        """The native MIGraphX engine on the directory's programs (read-only unless writable): the first
        program's key is checked against the manifest here, so a mismatch is named before anything loads."""
        from onnxaccel.engines.migraphx import MigraphxEngine

        self.find(MigraphxEngine().key_for(bound, target).to_dict())
        programs = self.root / PROGRAMS
        if not self.writable:
            serve_read_only(programs)
        return _compiled(bound, target.with_options({"cache": "1", "model_cache_dir": str(programs)}), strict,
                         loaded=not self.writable)

    def _uncached(self, bound: Model, target: Target, strict: bool, variant) -> Runner:
        """A target whose provider keeps nothing compiled (ROCm EP): the converted variant from the directory
        when the precision needs one, else the model itself; the session is built (counted as compiled)."""
        if target.precision_is_native:
            return _compiled(bound, target, strict, loaded=False)
        with self._lock:
            found = self._variant_artifact(bound, target, variant)
        run = dataclasses.replace(bound, path=self.path(found), proto=onnx.load(str(self.path(found)),
                                  load_external_data=False), notes=tuple(bound.notes) + tuple(found.notes))
        return _compiled(run, dataclasses.replace(target, precision="fp32"), strict, loaded=False)

    def _variant_model(self, artifact: Artifact, bound: Model) -> Model:
        """The model a provider-cache session is built from: the variant it was made from, else ``bound``."""
        if artifact.variant is None:
            return bound
        path = self.path(self.manifest.get(artifact.variant))
        return dataclasses.replace(bound, path=path, proto=onnx.load(str(path), load_external_data=False),
                                   notes=tuple(bound.notes) + tuple(artifact.notes))

    # -- making (writable store) ------------------------------------------------------------------------

    def _make_session(self, kind: str, key: dict, bound: Model, target: Target, variant) -> Artifact:
        """Make the session artifact of ``key``: an optimized model, or the folder a provider fills with its
        programs as the start runs (the files are listed at :meth:`commit`)."""
        start = time.perf_counter()
        made = variant() if variant is not None else None
        source = made.model if made is not None else bound
        converted = bool(made is not None and made.converted)
        base = self._variant_artifact(bound, target, lambda: made) if converted else None
        folder = f"{kind}-{_digest(key)}"
        if kind == "ort-optimized":
            engine_target = made.engine_target if made is not None else target
            how = self.builder.optimize(source, engine_target, self.root / folder / MODEL_FILE)
            files = [f"{folder}/{MODEL_FILE}"]
        else:
            cache = providers.get(target.device).compile_cache
            (self.root / folder / cache.folder).mkdir(parents=True, exist_ok=True)
            how = f"saved by {target.provider} as the start ran each input shape"
            files = [f"{folder}/{cache.folder}" if cache.folder else folder]
        artifact = Artifact(folder, kind, key, files, seconds=time.perf_counter() - start, converted=converted,
                            variant=base.id if base is not None else None,
                            notes=list(base.notes) if base is not None else [], how=how)
        return self._record(artifact)

    def _variant_artifact(self, bound: Model, target: Target, variant) -> Artifact:
        """The converted model of ``bound`` for ``target``'s precision, from the directory (made when writable)."""
        plain = dataclasses.replace(target, options=(), device_id=None)
        key = compile_key("variant", bound, plain, {}, runtime={}, host="").to_dict()
        found = self.find(key)
        if found is None:
            start = time.perf_counter()
            made = variant()
            # Without where this machine cached it: the note travels with the directory.
            conversion = [re.sub(r" \(cached at [^)]*\)", "", n) for n in made.model.notes if n not in bound.notes]
            found = self._save(key, made.model, start, what=f"{target.precision} variant", notes=conversion,
                               how=f"converted to {target.precision} for {target.device}")
            found.converted = True
        return found

    def _save(self, key: dict, model: Model, start: float, *, what: str, notes: list[str] = (),
              how: str = "") -> Artifact:
        """Copy ``model`` into the directory as the artifact of ``key`` (checked, atomically) and record it."""
        folder = f"{key['kind']}-{_digest(key)}"
        self.builder.save_model(model, self.root / folder / MODEL_FILE, what=what)
        artifact = Artifact(folder, key["kind"], key, [f"{folder}/{MODEL_FILE}"],
                            seconds=time.perf_counter() - start, notes=list(notes), how=how or what)
        return self._record(artifact)

    def _record(self, artifact: Artifact) -> Artifact:
        self.manifest.put(artifact)
        self.made.append(artifact)
        return artifact

    def commit(self) -> Path:
        """Write the manifest (writable store): every artifact's files and size as they are now, and the native
        MIGraphX programs the engine saved under ``programs/`` (one artifact per program, its key.json's key)."""
        if not self.writable:
            raise ArtifactError(f"{self.root} is open read-only.", "Only `onnxaccel compile` writes a directory.")
        self._native_programs()
        for artifact in self.manifest.artifacts:  # files as they are now (a provider adds one per shape it ran)
            base = self.root / (f"{PROGRAMS}/{artifact.id}" if artifact.kind == NATIVE_KIND else artifact.id)
            found = sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file())
            artifact.files = artifact.files[:1] + [f for f in found if f not in artifact.files[:1]]
            artifact.size_bytes = sum((self.root / f).stat().st_size for f in found)
        return write_manifest(self.root, self.manifest)

    def _native_programs(self) -> None:
        """An artifact per program the native engine saved under ``programs/`` and the manifest lacks."""
        import json

        known = {a.id for a in self.manifest.artifacts}
        for record in sorted((self.root / PROGRAMS).glob(f"{NATIVE_KIND}-*/key.json")):
            if record.parent.name not in known:
                data = json.loads(record.read_text())
                self._record(Artifact(record.parent.name, NATIVE_KIND, data["key"],
                                      [f"{PROGRAMS}/{record.parent.name}/{PROGRAM_FILE}"],
                                      seconds=data.get("first_compile_seconds"), how="compiled by MIGraphX",
                                      created=data.get("created", time.time())))


def _made_model(path: Path) -> Model:
    """The model at ``path`` (loaded, not checked again: onnxaccel made and checked it)."""
    from onnxaccel.model import load_model

    return load_model(str(path), check=False)


def _compiled(model: Model, target: Target, strict: bool, *, loaded: bool) -> Runner:
    """Build the runner and count it (engines/build_counts.py)."""
    from onnxaccel.engines import compile_model  # lazy: engines/__init__ imports the engines

    runner = compile_model(model, target, strict=strict)
    count_session(target.engine, loaded=loaded)
    return runner


def _digest(key: dict) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


# -- the active store -----------------------------------------------------------------------------------

_ACTIVE: list[ArtifactStore] = []
_FROM_ENV: dict[str, tuple[int, ArtifactStore]] = {}
_ENV_LOCK = threading.Lock()


def active() -> ArtifactStore | None:
    """The store runners are built from now: the innermost :func:`use`, else ``ONNXACCEL_ARTIFACTS`` (opened once
    per manifest version), else None."""
    if _ACTIVE:
        return _ACTIVE[-1]
    directory = os.environ.get(ARTIFACTS_ENV)
    if not directory:
        return None
    with _ENV_LOCK:
        manifest = Path(directory).expanduser() / MANIFEST
        stamp = manifest.stat().st_mtime_ns if manifest.is_file() else -1
        cached = _FROM_ENV.get(directory)
        if cached is None or cached[0] != stamp:
            cached = _FROM_ENV[directory] = (stamp, ArtifactStore(directory))
        return cached[1]


class ArtifactUse:
    """A store made active by :func:`use` until :meth:`close` (or the end of a ``with`` block)."""

    def __init__(self, store: ArtifactStore):
        self.store = store
        self._env = os.environ.get(ARTIFACTS_ENV)
        _ACTIVE.append(store)
        if not store.writable:  # processes this one starts (serve's workers and model process) use it too
            os.environ[ARTIFACTS_ENV] = str(store.root)

    def __enter__(self) -> ArtifactStore:
        return self.store

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Make the store inactive again (and ``ONNXACCEL_ARTIFACTS`` what it was)."""
        if self.store in _ACTIVE:
            _ACTIVE.remove(self.store)
            if not self.store.writable:
                if self._env is None:
                    os.environ.pop(ARTIFACTS_ENV, None)
                else:
                    os.environ[ARTIFACTS_ENV] = self._env


def use(directory: str | os.PathLike, *, builder: ArtifactBuilder | None = None) -> ArtifactUse:
    """Make the directory the active store now: ``with artifacts.use(DIR): ...``, or ``artifacts.use(DIR)`` and
    ``.close()`` later. Read-only without ``builder`` (and exported as ``ONNXACCEL_ARTIFACTS`` to child processes);
    writable with one (``onnxaccel compile``, in this process only)."""
    return ArtifactUse(ArtifactStore(directory, builder=builder))
