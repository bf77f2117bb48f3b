"""The manifest of an artifacts directory (``onnxaccel compile -o DIR``): what each artifact is, its files, and
the key it was made under; and the errors that say why a start cannot use one.

``DIR/manifest.json`` (schema ``onnxaccel.artifacts/1``)::

    {"schema": "onnxaccel.artifacts/1", "created": ..., "updated": ..., "onnxaccel": "0.x", "machine": {...},
     "artifacts": [{"id": "ort-optimized-<digest>", "kind": "ort-optimized", "files": ["ort-optimized-.../model.onnx"],
                    "size_bytes": ..., "seconds": ..., "key": {...}, "converted": true, "variant": "variant-...",
                    "notes": [...], "created": ...}, ...]}

A key is a :class:`~onnxaccel.engines.cache_key.CompileKey` as a dict (the embedded copy's has a ``preset``
instead of a target). Its fields fall in two groups: :data:`IDENTITY` says what the artifact is (the model's
content hash, the target string less the options that only point at caches, the precision, the input shapes, the
INT8 calibration data, the embedded preset), :data:`ENVIRONMENT` where it was made (the runtime versions: ONNX
Runtime's version and installed distributions, MIGraphX's version and build, ROCm, the NVIDIA driver, CUDA and
TensorRT; the host: the CPU model, or the GPU models or architectures; engines/runtime_info.py). A start looks
its key up by identity: none found is :class:`~onnxaccel.errors.ArtifactMissingError`, one found under
another environment is :class:`~onnxaccel.errors.ArtifactMismatchError` naming each field that differs.
Neither is ever answered by compiling.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from onnxaccel.errors import ArtifactError, ArtifactMismatchError, ArtifactMissingError

SCHEMA = "onnxaccel.artifacts/1"
MANIFEST = "manifest.json"
#: Key fields that say what an artifact is: a lookup matches all of them.
IDENTITY = ("kind", "model_sha256", "target", "precision", "shapes", "calibration", "preset")
#: Key fields that say where it was made: a difference is a mismatch, named field by field.
ENVIRONMENT = ("runtime", "host")
#: What each kind of artifact is, as the manifest and `compile`'s table say it.
TITLES = {
    "variant": "precision variant (a model converted here)",
    "embedded": "copy with preprocessing embedded",
    "ort-optimized": "ONNX Runtime optimized model",
    "migraphx": "MIGraphX EP programs (.mxr)",
    "tensorrt": "TensorRT engines",
    "migraphx-native": "MIGraphX program (.mxr)",
}
FIX = ("Run `onnxaccel compile` on this machine (same model, --target, shapes and --for as this start) into a "
       "fresh -o DIR and point ONNXACCEL_ARTIFACTS at it; or opt in to compiling at start-up by starting without "
       "ONNXACCEL_ARTIFACTS (slower; nothing is written to the directory).")


@dataclass
class Artifact:
    """One artifact: ``id`` (its folder, relative to the directory), ``kind`` (a key of :data:`TITLES`), its
    files (relative paths), total size, the seconds it took to make, the key it was made under, whether it was
    made from a model converted here (the engine then runs it as FP32: its graph already has the precision) and
    from which variant artifact, how it was made (``how``), and the notes of the conversion (``notes``: a runner
    built from it carries them, as one built from the converted model would)."""

    id: str
    kind: str
    key: dict
    files: list[str] = field(default_factory=list)
    size_bytes: int = 0
    seconds: float | None = None
    converted: bool = False
    variant: str | None = None
    notes: list[str] = field(default_factory=list)
    how: str = ""
    created: float = field(default_factory=time.time)

    @property
    def what(self) -> str:
        """What the artifact is, in words."""
        return TITLES.get(self.kind, self.kind)

    def to_dict(self) -> dict:
        """JSON-ready, as the manifest holds it."""
        return {"id": self.id, "kind": self.kind, "what": self.what, "files": list(self.files),
                "size_bytes": self.size_bytes, "seconds": self.seconds, "key": self.key, "converted": self.converted,
                "variant": self.variant, "notes": list(self.notes), "how": self.how, "created": self.created}

    @classmethod
    def from_dict(cls, data: dict) -> Artifact:
        """Read back what :meth:`to_dict` wrote."""
        return cls(id=data["id"], kind=data["kind"], key=dict(data["key"]), files=list(data.get("files", [])),
                   size_bytes=int(data.get("size_bytes", 0)), seconds=data.get("seconds"),
                   converted=bool(data.get("converted", False)), variant=data.get("variant"),
                   notes=list(data.get("notes", [])), how=str(data.get("how", "")),
                   created=float(data.get("created", 0.0)))


@dataclass
class Manifest:
    """Every artifact of a directory, and when and where the directory was made."""

    artifacts: list[Artifact] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    updated: float | None = None
    machine: dict = field(default_factory=lambda: {"hostname": platform.node(), "platform": platform.platform()})

    def to_dict(self) -> dict:
        """JSON-ready, schema :data:`SCHEMA`."""
        from onnxaccel import __version__

        return {"schema": SCHEMA, "created": self.created, "updated": self.updated, "onnxaccel": __version__,
                "machine": self.machine, "artifacts": [a.to_dict() for a in self.artifacts]}

    def find(self, key: dict) -> Artifact | None:
        """The artifact made under ``key`` (same identity, same environment); None when there is none of that
        identity; :class:`ArtifactMismatchError` when there is one made under another environment."""
        same = [a for a in self.artifacts if identity(a.key) == identity(key)]
        exact = next((a for a in same if environment(a.key) == environment(key)), None)
        if exact is None and same:
            raise mismatch(key, same[0])
        return exact

    def get(self, artifact_id: str) -> Artifact:
        """The artifact whose id is ``artifact_id`` (an ArtifactError when the manifest has none)."""
        found = next((a for a in self.artifacts if a.id == artifact_id), None)
        if found is None:
            raise ArtifactError(f"The manifest names an artifact '{artifact_id}' it does not list.", FIX)
        return found

    def put(self, artifact: Artifact) -> None:
        """Add ``artifact``, replacing one of the same id."""
        self.artifacts = [a for a in self.artifacts if a.id != artifact.id] + [artifact]


def identity(key: dict) -> tuple:
    """The fields of ``key`` that say what an artifact is."""
    return tuple(json.dumps(key.get(name), sort_keys=True) for name in IDENTITY)


def environment(key: dict) -> tuple:
    """The fields of ``key`` that say where it was made."""
    return tuple(json.dumps(key.get(name), sort_keys=True) for name in ENVIRONMENT)


def read_manifest(directory: Path) -> Manifest:
    """The manifest of ``directory``; an ArtifactError saying what is wrong when it is not an artifacts
    directory, cannot be read, or has another schema."""
    path = directory / MANIFEST
    if not directory.is_dir():
        raise ArtifactError(f"The artifacts directory {directory} does not exist.",
                            "Make it with `onnxaccel compile SOURCE -o DIR`, or fix ONNXACCEL_ARTIFACTS.")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{directory} is not an artifacts directory: it has no {MANIFEST}.",
                            "Make it with `onnxaccel compile SOURCE -o DIR`, or fix ONNXACCEL_ARTIFACTS.") from None
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"Cannot read {path}: {exc}", FIX) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ArtifactError(f"{path} has schema {found!r}; this onnxaccel reads {SCHEMA}.", FIX)
    try:
        artifacts = [Artifact.from_dict(a) for a in data.get("artifacts", [])]
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path} lists an artifact without {exc}.", FIX) from None
    return Manifest(artifacts, float(data.get("created", 0.0)), data.get("updated"), dict(data.get("machine", {})))


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    """Write the manifest atomically (temporary file + rename): a reader never sees half of one."""
    manifest.updated = time.time()
    path = directory / MANIFEST
    tmp = path.with_name(f".{MANIFEST}.{os.getpid()}")
    tmp.write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def differences(here: dict, there: dict) -> list[tuple[str, str, str]]:
    """(field, value here, value in the manifest) for each environment field of two keys that differs: each
    runtime entry on its own (``dist:NAME`` is an installed distribution, e.g. onnxruntime-gpu), then the host."""
    found = []
    mine, theirs = here.get("runtime") or {}, there.get("runtime") or {}
    for name in sorted(set(mine) | set(theirs)):
        if mine.get(name) != theirs.get(name):
            label = f"{name[5:]} (installed package)" if name.startswith("dist:") else name
            found.append((label, mine.get(name) or "absent", theirs.get(name) or "absent"))
    if here.get("host") != there.get("host"):
        host = str(here.get("host") or "")
        label = "GPU" if host.startswith(("nvidia", "amd")) else "host"
        found.append((label, host or "unknown", str(there.get("host") or "unknown")))
    return found


def mismatch(key: dict, found: Artifact) -> ArtifactMismatchError:
    """The error for an artifact of the right identity made under another environment: every field named."""
    diffs = differences(key, found.key)
    listed = "; ".join(f"{name} {here} here, {there} in the manifest" for name, here, there in diffs)
    return ArtifactMismatchError(
        f"The artifacts directory holds the {found.what} for {_subject(key)}, made under other runtime versions "
        f"or hardware ({found.id}): {listed}. It is not loaded, and nothing is compiled in its place.",
        FIX, differences=diffs)


def missing(key: dict, directory: Path, manifest: Manifest) -> ArtifactMissingError:
    """The error for a key the directory holds nothing of: what was asked, and what it holds of the same model
    (the fields that differ), or which models it holds."""
    kind = key.get("kind")
    same_model = [a for a in manifest.artifacts if a.kind == kind and a.key.get("model_sha256") == key.get(
        "model_sha256")]
    if same_model:
        held = "; ".join(_subject(a.key) for a in same_model[:6])
        have = f"for this model it holds: {held}"
    else:
        models = sorted({Path(str(a.key.get("model", "?"))).name for a in manifest.artifacts})
        have = f"it holds artifacts of {', '.join(models)}" if models else "it holds no artifacts"
    return ArtifactMissingError(
        f"{directory} has no {TITLES.get(kind, kind)} for {_subject(key)}; {have}. Nothing is compiled in its "
        "place (read-only artifacts).", FIX)


def _subject(key: dict) -> str:
    """What a key is for, in words: model, target or preset, shapes."""
    model = Path(str(key.get("model", "?"))).name
    what = f"preset {key['preset']}" if key.get("preset") else str(key.get("target", "?"))
    shapes = key.get("shapes") or {}
    at = " at " + ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items()) if shapes else ""
    return f"{model} on {what}{at}"
