"""How this onnxaccel was installed, and the install commands that are right for it.

A fix that says ``pip install 'onnxaccel[cuda]'`` is wrong for most users today: they installed a source
checkout (``pip install -e .``), and onnxaccel is not on their package index, so the command fails after the
``pip uninstall`` before it removed their runtime. Every hint that installs something asks
:func:`install_command` instead, which reads the install's PEP 610 record (``direct_url.json``, written by pip
for a local directory, editable or not, and absent for a package from an index) and answers:

- ``index``: ``python -m pip install 'onnxaccel[cuda]'``
- ``editable`` (a checkout installed with ``pip install -e``): ``python -m pip install -e '/path/to/checkout[cuda]'``
- ``local`` (a directory or wheel file installed without -e): ``python -m pip install '/path[cuda]'``
- ``source`` (not installed; run from ``src`` on PYTHONPATH): ``python -m pip install -e '/checkout[cuda]'``

``python`` is the interpreter running onnxaccel, so the command installs into the same environment. Commands
stay copy-pasteable; that this runs in a container (``/.dockerenv`` or ``/run/.containerenv``), where a change
belongs in the image's build, is said once, by ``doctor`` (:func:`describe`).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    from importlib import metadata

#: Files container runtimes create in a container's root: Docker's /.dockerenv, Podman's /run/.containerenv.
CONTAINER_MARKERS = (Path("/.dockerenv"), Path("/run/.containerenv"))


@dataclass(frozen=True)
class InstallMode:
    """How onnxaccel is installed: ``kind`` (index, editable, local, source), ``location`` (the checkout or
    file for the local kinds), whether this runs in a container, and the interpreter to install with."""

    kind: str
    location: str = ""
    container: bool = False
    python: str = sys.executable or "python"

    def requirement(self, extra: str = "") -> str:
        """What pip is given: ``onnxaccel[extra]`` or ``/checkout[extra]``."""
        base = self.location if self.kind != "index" else "onnxaccel"
        return f"{base}[{extra}]" if extra else base

    def install(self, extra: str = "") -> str:
        """The command that installs onnxaccel with ``extra`` the way it is installed now."""
        editable = "-e " if self.kind in ("editable", "source") else ""
        return f"{shlex.quote(self.python)} -m pip install {editable}{shlex.quote(self.requirement(extra))}"

    def uninstall(self, packages: list[str] | tuple[str, ...]) -> str:
        """The command that removes ``packages`` from the same environment."""
        return f"{shlex.quote(self.python)} -m pip uninstall -y {' '.join(packages)}"

    def to_dict(self) -> dict:
        """JSON-ready, for doctor --json."""
        return {"kind": self.kind, "location": self.location, "container": self.container, "python": self.python}


def install_mode(distribution: metadata.Distribution | None = None, *, module_file: str | None = None,
                 markers: tuple[Path, ...] = CONTAINER_MARKERS) -> InstallMode:
    """How onnxaccel was installed: from ``distribution`` (default: the installed one, if any) and, where none
    is installed, from where the package's source lies (``module_file``)."""
    container = any(p.exists() for p in markers)
    if distribution is None:
        from importlib import metadata  # here, not at import: it loads email, zipfile and csv

        try:
            distribution = metadata.distribution("onnxaccel")
        except metadata.PackageNotFoundError:
            distribution = None
    if distribution is None:
        source = Path(module_file or __file__).resolve()
        root = next((p for p in source.parents if (p / "pyproject.toml").is_file()), source.parent)
        return InstallMode("source", str(root), container)
    text = distribution.read_text("direct_url.json")
    if not text:
        return InstallMode("index", "", container)
    try:
        record = json.loads(text)
    except ValueError:
        return InstallMode("index", "", container)
    url = urlparse(record.get("url", ""))
    location = unquote(url.path) if url.scheme == "file" else record.get("url", "")
    if record.get("dir_info", {}).get("editable"):
        return InstallMode("editable", location, container)
    if url.scheme == "file":
        return InstallMode("local", location, container)
    return InstallMode("index", "", container)  # a VCS or archive URL: the index is the portable fix


def install_command(extra: str = "") -> str:
    """The command that installs onnxaccel with ``extra`` as this onnxaccel was installed."""
    return install_mode().install(extra)


def swap_command(remove: list[str] | tuple[str, ...], extra: str) -> str:
    """Remove the runtime distributions ``remove`` and install onnxaccel with ``extra`` (which brings the right
    one), both in this environment."""
    mode = install_mode()
    return f"{mode.uninstall(list(remove) or ['onnxruntime'])} && {mode.install(extra)}"


def describe(mode: InstallMode | None = None) -> str:
    """One line for doctor: how onnxaccel is installed and what its fix commands therefore look like."""
    mode = mode or install_mode()
    where = {"index": "from the package index", "editable": f"from a checkout at {mode.location} (pip install -e)",
             "local": f"from {mode.location} (not editable)",
             "source": f"not installed: run from the source at {mode.location}"}[mode.kind]
    tail = "; this is a container: make install changes in the image's build too" if mode.container else ""
    return f"onnxaccel {where}, Python {mode.python}{tail}"
