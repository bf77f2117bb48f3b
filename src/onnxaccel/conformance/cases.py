"""Find ONNX test cases on disk and read their data sets.

The layout is the one ONNX's backend tests, ONNX Runtime's ``onnx_test_runner`` and the ONNX Model Zoo share:
a folder holding a model (``model.onnx``; Model Zoo archives may name it after the model) next to
``test_data_set_N/`` folders of ``input_K.pb`` and ``output_K.pb``, K in the order of the graph's inputs and
outputs (onnx/onnx, onnx/backend/test/cmd_tools.py ``generate_data``, release 1.23.0). A ``data.json`` beside
the model may give the case's own ``rtol``/``atol`` (onnx/backend/test/loader/__init__.py reads it so).

ONNX's "real" cases hold only a ``data.json`` with the model's URL. When the URL names one of the "light"
models shipped inside the onnx package (``onnx/backend/test/data/light/light_NAME.onnx``), the case runs as
ONNX's runner runs it: one input filled with ``arange(n) / n`` and the expected output
``light_NAME_output_0.pb`` (onnx/backend/test/runner/__init__.py ``generate_dummy_data``, release 1.23.0);
otherwise it is skipped, since it needs a download. The "light" folder itself (``light_NAME.onnx`` beside
``light_NAME_output_K.pb``) is read the same way.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from onnxaccel.errors import InputError

DATA_SET = re.compile(r"test_data_set_(\d+)$")
INPUT_FILE = re.compile(r"input_(\d+)\.pb$")
OUTPUT_FILE = re.compile(r"output_(\d+)\.pb$")
LIGHT_URL_PREFIX = "onnx/backend/test/data/light/"
#: A case whose data sets hold no output_K.pb: ONNX's runner would run it and compare nothing
#: (onnx/backend/test/runner/__init__.py reads as many outputs as there are files), so no result could be
#: judged; it is skipped with this reason rather than passed.
NO_OUTPUTS = "no output_K.pb in any test_data_set_N: nothing to compare"


@dataclass(frozen=True)
class DataSet:
    """One set of input files and the outputs expected from them. ``inputs`` may be empty for a case whose
    inputs are generated (ONNX's light models)."""

    name: str
    inputs: tuple[Path, ...]
    outputs: tuple[Path, ...]

    def to_dict(self) -> dict:
        """JSON-ready form of the data set (paths as text)."""
        return {"name": self.name, "inputs": [str(p) for p in self.inputs], "outputs": [str(p) for p in self.outputs]}


@dataclass(frozen=True)
class TestCase:
    """A model and its data sets; ``skip`` says why it cannot run here (then nothing else is set)."""

    name: str
    folder: Path
    model: Path | None = None
    data_sets: tuple[DataSet, ...] = ()
    rtol: float | None = None
    atol: float | None = None
    #: "arange" when the inputs are generated as ONNX's runner does for its light models.
    generated_inputs: str | None = None
    skip: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    __test__ = False  # not a pytest class

    def to_dict(self) -> dict:
        """JSON-ready form of the test case."""
        return {"name": self.name, "folder": str(self.folder), "model": str(self.model) if self.model else None,
                "data_sets": [d.to_dict() for d in self.data_sets], "rtol": self.rtol, "atol": self.atol,
                "generated_inputs": self.generated_inputs, "skip": self.skip, "notes": list(self.notes)}


def discover(paths: Sequence[str | os.PathLike], *, patterns: Sequence[str] = ()) -> list[TestCase]:
    """Test cases in the given folders: a case folder itself, or every case found below a parent folder.

    ``patterns`` (shell globs) keep the cases whose name matches one of them. Cases come out sorted by
    name within each path, in the order the paths were given; a case reached twice (the same folder, from
    itself and from a parent, or through a symlink) is kept once. Different case folders are different cases
    even when they share a model file (a symlinked ``model.onnx``, or ONNX's "real" cases that run the
    shipped "light" models): each folder's expected outputs are its own.
    """
    cases: dict[tuple[Path, str | None], TestCase] = {}
    for raw in paths:
        root = Path(raw).expanduser()
        if not root.exists():
            raise InputError(f"Test case path not found: {raw}",
                             "Pass a folder holding model.onnx and test_data_set_*/, or a folder of such folders.")
        if root.is_file():
            root = root.parent if root.suffix == ".onnx" or root.name == "data.json" else root
        found = list(_walk(root))
        if not found:
            raise InputError(
                f"No ONNX test case in {raw}.",
                "A test case is a folder holding model.onnx (or one .onnx file) and test_data_set_N/input_K.pb + "
                "output_K.pb, as ONNX's backend test data and the ONNX Model Zoo archives are laid out.",
            )
        for case in sorted(found, key=lambda c: c.name):
            cases.setdefault(_identity(case), case)
    selected = list(cases.values())
    if patterns:
        selected = [c for c in selected if any(fnmatch.fnmatchcase(c.name, p) or fnmatch.fnmatchcase(
            c.folder.name, p) for p in patterns)]
    return selected


def _identity(case: TestCase) -> tuple[Path, str | None]:
    """What makes a case the same case: its folder, resolved, and for the light models that share one
    folder (``light_NAME.onnx``) the model's file name. Never the model's resolved path."""
    return case.folder.resolve(), case.model.name if case.model is not None else None


def _walk(root: Path) -> Iterable[TestCase]:
    """Cases in ``root`` itself and below it, named by their path relative to ``root``'s parent."""
    base = root.parent
    for folder, dirs, files in os.walk(root):
        entries = set(files) | set(dirs)
        dirs[:] = sorted(d for d in dirs if not DATA_SET.match(d) and not d.startswith("."))
        here = Path(folder)
        name = here.relative_to(base).as_posix()
        case = read_case(here, name, files=entries)
        if case is not None:
            yield case
            dirs[:] = []  # a case folder's subfolders are its data sets
        for light in _light_cases(here, files, name):
            yield light


def read_case(folder: Path, name: str | None = None, *, files: set[str] | None = None) -> TestCase | None:
    """The test case in ``folder``, or None when the folder is not one."""
    files = set(os.listdir(folder)) if files is None else files
    name = name or folder.name
    has_sets = any(DATA_SET.match(f) and (folder / f).is_dir() for f in files)
    models = sorted(f for f in files if f.endswith(".onnx"))
    meta = _read_json(folder / "data.json") if "data.json" in files else None
    rtol, atol = (meta or {}).get("rtol"), (meta or {}).get("atol")
    if "model.onnx" in models:
        model = folder / "model.onnx"
    elif len(models) == 1 and (has_sets or _legacy_npz(files)):
        model = folder / models[0]
    elif meta is not None and "url" in meta:
        return _real_case(folder, name, meta)
    else:
        return None
    if not has_sets:
        if _legacy_npz(files):
            return TestCase(name, folder, model, skip="test data only as test_data_*.npz (pickled arrays, not "
                            "read for safety): convert it to test_data_set_N/*.pb")
        return TestCase(name, folder, model, skip="no test_data_set_N folder beside the model")
    sets = tuple(_data_set(folder / f) for f in sorted(files, key=_set_order) if DATA_SET.match(f)
                 and (folder / f).is_dir())
    if not any(d.outputs for d in sets):
        return TestCase(name, folder, model, skip=NO_OUTPUTS)
    return TestCase(name, folder, model, sets, rtol=rtol, atol=atol)


def _data_set(folder: Path) -> DataSet:
    files = os.listdir(folder)
    inputs = sorted((f for f in files if INPUT_FILE.match(f)), key=lambda f: int(INPUT_FILE.match(f).group(1)))
    outputs = sorted((f for f in files if OUTPUT_FILE.match(f)), key=lambda f: int(OUTPUT_FILE.match(f).group(1)))
    return DataSet(folder.name, tuple(folder / f for f in inputs), tuple(folder / f for f in outputs))


def _set_order(name: str) -> int:
    match = DATA_SET.match(name)
    return int(match.group(1)) if match else -1


def _legacy_npz(files: set[str]) -> bool:
    return any(f.startswith("test_data_") and f.endswith(".npz") for f in files)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _real_case(folder: Path, name: str, meta: dict) -> TestCase:
    url = str(meta.get("url", ""))
    rtol, atol = meta.get("rtol"), meta.get("atol")
    if url.startswith(LIGHT_URL_PREFIX):
        model = onnx_package_root() / url
        if model.is_file():
            outputs = _light_outputs(model)
            if outputs:
                return TestCase(name, folder, model, (DataSet("generated", (), outputs),), rtol=rtol, atol=atol,
                                generated_inputs="arange", notes=(f"runs the light model {model.name} shipped in "
                                                                  "the onnx package, as ONNX's runner does",))
    return TestCase(name, folder, rtol=rtol, atol=atol,
                    skip=f"the model must be downloaded ({url or 'no URL'}); check runs without network access")


def _light_cases(folder: Path, files: Iterable[str], name: str) -> Iterable[TestCase]:
    """``light_NAME.onnx`` beside ``light_NAME_output_K.pb`` (onnx/backend/test/data/light)."""
    for file in sorted(files):
        if not file.endswith(".onnx") or file == "model.onnx":
            continue
        model = folder / file
        outputs = _light_outputs(model)
        if outputs:
            yield TestCase(f"{name}/{model.stem}", folder, model, (DataSet("generated", (), outputs),),
                           generated_inputs="arange")


def _light_outputs(model: Path) -> tuple[Path, ...]:
    outputs = []
    while (path := model.with_name(f"{model.stem}_output_{len(outputs)}.pb")).is_file():
        outputs.append(path)
    return tuple(outputs)


def onnx_package_root() -> Path:
    """The folder that holds the installed ``onnx`` package (URLs in ONNX's data.json are relative to it)."""
    import onnx

    return Path(onnx.__file__).resolve().parent.parent
