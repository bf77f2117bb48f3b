"""Imports flow one way, without cycles between modules or packages, and every module is at most 450 lines
(docs/ARCHITECTURE.md, "Layers" and "Rules the checks enforce"): scripts/check_imports.py runs in CI through here.

The checker must exit 0. Problems it reports must be a subset of KNOWN (empty), each with the step that removes
it: a NEW upward or sideways import, a new cycle or a module grown too long fails at once; a known problem that is
gone must leave KNOWN too, so the list only shrinks (to nothing).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check_imports.py"

#: Problems still open, without their "file:line: " prefix (lines move), and who removes them.
KNOWN: dict[str, str] = {}

_LOCATION = re.compile(r"^\S+\.py:\d+: ")


def _problems(stdout: str) -> list[str]:
    return [_LOCATION.sub("", line) for line in stdout.splitlines() if line.strip()]


def test_imports_flow_one_way_except_the_known_open_problems():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300)
    problems = _problems(done.stdout)
    new = sorted(set(problems) - set(KNOWN))
    assert not new, "new import problem(s) (fix the import, do not add it to KNOWN):\n" + "\n".join(new)
    gone = sorted(set(KNOWN) - set(problems))
    assert not gone, "fixed, so remove from KNOWN in tests/test_imports.py:\n" + "\n".join(gone)
    assert done.returncode == (1 if problems else 0), done.stderr


def _checker(root: Path):
    spec = importlib.util.spec_from_file_location("check_imports_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.ROOT = root
    return module


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_fails_on_upward_sideways_hidden_and_cyclic_imports(tmp_path):
    root = tmp_path / "src" / "onnxaccel"
    _write(root, {
        "__init__.py": "",
        "errors.py": "",
        "model.py": "from onnxaccel.cli import main\n",  # upward: the core may not know the CLI
        "cli/__init__.py": "", "cli/main.py": "",
        "serve/__init__.py": "", "serve/protocol.py": "",
        "bench/__init__.py": "", "bench/stats.py": "",
        # sideways, hidden in a function: still counted
        "bench/report.py": "def f():\n    from onnxaccel.serve import protocol\n",
        # allowed (docs/ARCHITECTURE.md, "Layers"): loadtest may use bench's statistics; TYPE_CHECKING imports do not count
        "loadtest/__init__.py": "from typing import TYPE_CHECKING\nfrom onnxaccel.bench.stats import x\n"
                                "if TYPE_CHECKING:\n    from onnxaccel.cli import main\n",
        # the cycle zoo/__init__.py <-> zoo/registry.py had: a package importing a module that imports it back
        "zoo/__init__.py": "from onnxaccel.zoo.registry import entries\n",
        "zoo/registry.py": "from onnxaccel.zoo import bert\n",
        "zoo/bert.py": "",
    })
    problems = _problems("\n".join(_checker(root).check()))
    assert "upward import onnxaccel.model -> onnxaccel.cli" in problems
    assert "sideways import onnxaccel.bench.report -> onnxaccel.serve (bench may not use serve)" in problems
    assert "import cycle: onnxaccel.zoo -> onnxaccel.zoo.registry -> onnxaccel.zoo" in problems
    assert len(problems) == 3, problems

    _write(root, {"zoo/registry.py": "from onnxaccel.zoo.bert import BERT\n"})  # how the real cycle was fixed
    assert "import cycle: onnxaccel.zoo -> onnxaccel.zoo.registry -> onnxaccel.zoo" not in _checker(root).check()


def test_the_checker_fails_on_a_cycle_between_packages_that_no_two_modules_make(tmp_path):
    """engines.runner uses precision.fp16, and precision.calibrate uses engines.pool: no module imports one that
    imports it back, but the packages engines and precision each import the other (module-level imports count;
    function-local and TYPE_CHECKING ones do not)."""
    root = tmp_path / "src" / "onnxaccel"
    _write(root, {
        "__init__.py": "",
        "engines/__init__.py": "", "engines/pool.py": "",
        "engines/runner.py": "from onnxaccel.precision.fp16 import convert\n",
        "precision/__init__.py": "", "precision/fp16.py": "",
        "precision/calibrate.py": "from onnxaccel.engines.pool import RunnerPool\n",
    })
    cycle = ("package cycle: onnxaccel.engines -> onnxaccel.precision -> onnxaccel.engines "
             "(onnxaccel.engines.runner -> onnxaccel.precision.fp16; "
             "onnxaccel.precision.calibrate -> onnxaccel.engines.pool)")
    assert _problems("\n".join(_checker(root).check())) == [cycle]

    _write(root, {"precision/calibrate.py": "def f():\n    from onnxaccel.engines.pool import RunnerPool\n"})
    assert _checker(root).check() == []
    _write(root, {"precision/calibrate.py": "from typing import TYPE_CHECKING\n"
                                            "if TYPE_CHECKING:\n    from onnxaccel.engines.pool import RunnerPool\n"})
    assert _checker(root).check() == []


def test_the_checker_fails_on_a_module_over_450_lines(tmp_path):
    root = tmp_path / "src" / "onnxaccel"
    _write(root, {"__init__.py": "", "errors.py": "x = 1\n" * 450, "paths.py": "x = 1\n" * 451})
    assert _problems("\n".join(_checker(root).check())) == [
        "module too long: src/onnxaccel/paths.py 451 lines (at most 450)"]
