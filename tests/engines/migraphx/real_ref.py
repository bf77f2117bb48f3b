"""Find the real MIGraphX reference-target build (scripts/build-migraphx-ref) and import it for the tests.

Where it is: ONNXACCEL_MIGRAPHX_REF (the install prefix the script prints), else the newest complete build
under the script's cache folder (ONNXACCEL_MIGRAPHX_REF_CACHE, else $XDG_CACHE_HOME or ~/.cache, then
onnxaccel/migraphx-ref/) whose Python module was built for this interpreter. The module sits in PREFIX/lib
with a relative runpath (ROCm/AMDMIGraphX at f729a52, see ../shared/vendor/README.md).

A process can load this pybind11 extension from one path only (a second path runs its init again, which
registers its types twice), so the tests import it once, from the build itself. ``private_copy`` lays out a
copy of the module beside links to its libraries, for the cache-key tests to "rebuild" without touching the
shared build.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import sys
from pathlib import Path

REF_ENV = "ONNXACCEL_MIGRAPHX_REF"
CACHE_ENV = "ONNXACCEL_MIGRAPHX_REF_CACHE"


def module_pattern() -> str:
    return f"migraphx.cpython-{sys.version_info[0]}{sys.version_info[1]}*.so"


def cache_folder() -> Path:
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onnxaccel" / "migraphx-ref"


def _module_in(prefix: Path) -> Path | None:
    found = sorted((prefix / "lib").glob(module_pattern()))
    return found[0] if found else None


def locate() -> tuple[Path | None, str]:
    """``(python module file, "")`` of the build to test against, or ``(None, why not)``."""
    given = os.environ.get(REF_ENV)
    if given:
        module = _module_in(Path(given).expanduser())
        if module is None:
            return None, f"{REF_ENV}={given} has no lib/{module_pattern()} (built for another Python?)"
        return module, ""
    cache = cache_folder()
    builds = sorted((p for p in cache.glob("*") if (p / ".complete").is_file()),
                    key=lambda p: (p / ".complete").stat().st_mtime, reverse=True)
    for prefix in builds:
        module = _module_in(prefix)
        if module is not None:
            return module, ""
    if builds:
        return None, f"the MIGraphX builds in {cache} have no {module_pattern()} for this Python"
    return None, (f"no real MIGraphX reference-target build (run scripts/build-migraphx-ref, or set {REF_ENV} "
                  f"to its prefix; looked in {cache})")


def private_copy(module: Path, folder: Path) -> Path:
    """``folder`` with a copy of the module and links to every other file of its lib folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for item in module.parent.iterdir():
        target = folder / item.name
        if item == module:
            shutil.copy2(item, target)
        elif not target.exists():
            target.symlink_to(item.resolve())
    return folder / module.name


def import_module(path: Path):
    """Import the extension module at ``path`` as ``migraphx`` (not registered in sys.modules)."""
    loader = importlib.machinery.ExtensionFileLoader("migraphx", str(path))
    spec = importlib.util.spec_from_file_location("migraphx", str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
