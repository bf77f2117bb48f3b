"""The native MIGraphX engine's program cache: one compiled program per key, saved with ``migraphx.save``.

A compiled MIGraphX program holds GPU code objects for one architecture and one set of input shapes, built
by one MIGraphX version; ``migraphx.save(prog, path)`` writes it as msgpack (the default format) and
``migraphx.load(path)`` gives it back ready to run, without parsing or compiling (ROCm/AMDMIGraphX
src/py/migraphx_py.cpp at f729a52: ``save``/``load``, ``format="msgpack"``). So the key covers everything that changes
the program: the model's content, the target string (precision and compile options), the input shapes, the
calibration data for INT8, the MIGraphX version and build (its files: a rebuild of one release keeps the
version), the MIGraphX target (gpu, or ref in tests), ROCm's release and the GPU architecture(s) (KFD
topology, ``HSA_OVERRIDE_GFX_VERSION``).

Layout: ``<dir>/migraphx-native-<digest>/program.mxr`` and ``key.json``, the same record format as
``onnxaccel cache`` reads for the other compile caches (``onnxaccel.compile-cache/1``: key, created,
last_used, first_compile_seconds, warm_start_seconds, hits), keyed by the same :class:`CompileKey` as the EP
caches (engines/cache_key.py). ``<dir>`` is ``<cache_root>/compile`` unless the target says
``model_cache_dir=DIR``.

A root registered with :func:`serve_read_only` (the programs of an artifacts directory used read-only,
engines/artifacts.py) is only read: no record is updated, a program that does not load is not discarded, and a
program that is not there is an error (:meth:`ProgramCache.missing`) instead of a compile.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from onnxaccel.engines.cache_key import CompileKey, compile_cache_dir, compile_key
from onnxaccel.errors import ArtifactMissingError
from onnxaccel.model import Model
from onnxaccel.paths import record_cache_use
from onnxaccel.target import Target

KIND = "migraphx-native"
PROGRAM_FILE = "program.mxr"
#: Options that say where or whether to cache, not how the program is built.
_NOT_KEYED = {"cache", "model_cache_dir"}


def program_key(model: Model, target: Target, shapes: Mapping[str, Sequence[int]], *, runtime: dict[str, str],
                calibration: str | None = None, host: str | None = None) -> CompileKey:
    """The key of the program compiled from ``model`` at ``shapes`` for ``target`` (``host`` defaults to the
    GPU architectures here, :func:`host_id`)."""
    return compile_key(KIND, model, target, shapes, runtime=runtime, host=host if host is not None else host_id(),
                       not_keyed=_NOT_KEYED, calibration=calibration)


def native_runtime_versions(mgx_version: str, module_origin: str | None = None,
                            target_name: str = "gpu") -> dict[str, str]:
    """What builds the program besides the model: MIGraphX's version and build, ROCm's release, the target.

    ``__version__`` is "X.Y.Z.dev[+tweak]" for every build of a release (ROCm/AMDMIGraphX
    src/py/migraphx_py.cpp, since rocm-6.3.0: only VERSION_INFO, which its CMake never defines, would say
    more), so a MIGraphX rebuilt from other sources carries the same version. The build's files are keyed
    too (``migraphx_build_identity``): a rebuilt MIGraphX compiles afresh instead of loading a program the
    old one wrote.
    """
    found = {"migraphx": mgx_version, "migraphx_target": target_name}
    rocm = Path(os.environ.get("ROCM_PATH", "/opt/rocm"))
    with contextlib.suppress(OSError):
        found["rocm"] = (rocm / ".info" / "version").read_text().strip()
    if module_origin:
        found["migraphx_module"] = module_origin
        found["migraphx_build"] = migraphx_build_identity(module_origin)
    return found


def migraphx_build_identity(module_file: str) -> str:
    """A digest of the files that are this MIGraphX: the Python module and every ``libmigraphx*.so*`` in its
    folder and in the folders of the MIGraphX libraries this process has loaded (path, size, mtime).

    The set does not depend on what was loaded so far (``get_target`` dlopens libmigraphx_gpu/ref later, from
    the same folder), so one process computes the same key before and after compiling.
    """
    module = Path(module_file)
    # An install of ROCm/AMDMIGraphX f729a52 puts libmigraphx*.so in <lib>/migraphx/lib (the module's runpath
    # is $ORIGIN/../lib:$ORIGIN/../lib/migraphx/lib, read from the reference build); others may keep them
    # beside the module. /proc/self/maps names the ones really loaded, wherever they are.
    folders = {module.parent, module.parent / "migraphx" / "lib"}
    folders |= {lib.parent for lib in _loaded_migraphx_libraries()}
    files = {module.resolve()}
    for folder in folders:
        files.update(p.resolve() for p in folder.glob("libmigraphx*.so*"))
    lines = []
    for path in sorted(files):
        with contextlib.suppress(OSError):
            stat = path.stat()
            lines.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:20]


def _loaded_migraphx_libraries() -> set[Path]:
    """MIGraphX libraries mapped into this process (Linux /proc/self/maps; empty elsewhere)."""
    found = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and re.search(r"/libmigraphx[^/]*\.so[^/]*$", parts[5]):
                found.add(Path(parts[5]))
    return found


def host_id() -> str:
    """The GPU architectures the code objects are built for: gfx names from KFD's topology
    (``gfx_target_version`` 90402 -> gfx942, 110000 -> gfx1100, 90010 -> gfx90a:
    major, minor, stepping as decimal pairs)."""
    names = set()
    for props in glob.glob("/sys/class/kfd/kfd/topology/nodes/*/properties"):
        with contextlib.suppress(OSError, ValueError):
            found = re.search(r"gfx_target_version\s+(\d+)", Path(props).read_text())
            if found and int(found.group(1)):
                value = int(found.group(1))
                names.add(f"gfx{value // 10000}{(value // 100) % 100:x}{value % 100:x}")
    text = "amd " + (",".join(sorted(names)) if names else "unknown-gpu")
    override = os.environ.get("HSA_OVERRIDE_GFX_VERSION")
    return f"{text} (HSA_OVERRIDE_GFX_VERSION={override})" if override else text


def calibration_fingerprint(spec: str, samples: int) -> str:
    """Identify INT8 calibration data without reading it (so a warm start does not load images): the
    resolved path with each file's name, size and mtime, and the sample count."""
    if not spec or spec.strip().lower() == "synthetic":
        return f"synthetic|{samples}"
    path = Path(spec).expanduser().resolve()
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    parts = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files if p.exists()]
    return hashlib.sha256(f"{path}|{samples}|{'|'.join(parts)}".encode()).hexdigest()[:20]


#: Roots whose programs are loaded and never written (see the module docstring).
_READ_ONLY: set[Path] = set()


def serve_read_only(root: str | os.PathLike) -> None:
    """Make every :class:`ProgramCache` over ``root`` read-only in this process (an artifacts directory's
    programs: what is not there was not compiled ahead, and is an error)."""
    _READ_ONLY.add(Path(root).expanduser().resolve())


class ProgramCache:
    """Entries under ``root`` (``<cache_root>/compile`` by default); ``read_only`` where the root was registered
    with :func:`serve_read_only`."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root).expanduser() if root else compile_cache_dir()
        self.read_only = self.root.resolve() in _READ_ONLY

    def entry(self, key: CompileKey) -> Path:
        """The key's folder under this cache's root."""
        return self.root / key.name

    def program_path(self, key: CompileKey) -> Path:
        """Where the key's program file is (or would be)."""
        return self.entry(key) / PROGRAM_FILE

    def lookup(self, key: CompileKey) -> Path | None:
        """The key's program file when one was stored (non-empty), else None."""
        path = self.program_path(key)
        return path if path.is_file() and path.stat().st_size > 0 else None

    def store(self, key: CompileKey, save) -> Path:
        """Write a program through ``save(path)`` (migraphx.save), atomically: a reader never sees half a file."""
        path = self.program_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{PROGRAM_FILE}.{os.getpid()}.tmp")
        try:
            save(str(tmp))
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return path

    def discard(self, key: CompileKey) -> None:
        """Delete the key's program (one that would not load), keeping its record."""
        with contextlib.suppress(FileNotFoundError):
            self.program_path(key).unlink()

    def record(self, key: CompileKey, *, seconds: float, hit: bool) -> dict | None:
        """Update ``key.json``: first-compile time on a miss, warm-start time and hit count on a hit (nothing in
        a read-only root)."""
        if self.read_only:
            return None
        return record_cache_use(self.entry(key), key.to_dict(), seconds=seconds, hit=hit)

    def missing(self, key: CompileKey) -> ArtifactMissingError:
        """The error for a program a read-only root does not hold: the shapes asked, and those it holds for the
        same model and target (read from the entries' key.json)."""
        held = []
        for record in sorted(self.root.glob(f"{KIND}-*/key.json")):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                other = json.loads(record.read_text())["key"]
                if (other["model_sha256"], other["target"]) == (key.model_sha256, key.target):
                    held.append(_shapes_text(other["shapes"]))
        have = f"it holds this model's programs at {'; '.join(held)}" if held else "it holds none for this model"
        return ArtifactMissingError(
            f"No saved MIGraphX program for {key.target} at {_shapes_text(key.shapes)} in {self.root} (read-only "
            f"artifacts: nothing is compiled on the request path); {have}.",
            "Compile ahead for the shapes this start runs: onnxaccel compile with the same --target, --shape, "
            "--max-batch or --shape-buckets, on a machine like this one.")


def _shapes_text(shapes: Mapping[str, Sequence[int]]) -> str:
    return ", ".join(f"{name}={'x'.join(str(d) for d in dims)}" for name, dims in shapes.items())
