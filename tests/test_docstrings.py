"""Every public function and class in src/onnxaccel has a docstring (issue 19, item 6).

Public means: a module-level function or class, or a method/property/nested class of a public class, whose
name does not start with an underscore. Functions nested inside functions are implementation details and
are not walked. Definitions without one would have to be listed in KNOWN_MISSING (empty):
a NEW one fails at once, and one that gained its docstring must leave the list, so it only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "onnxaccel"

#: "path/relative/to/src/onnxaccel.py::Qualified.name" allowed without a docstring: none.
KNOWN_MISSING: frozenset[str] = frozenset()

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def missing_docstrings(root: Path) -> list[str]:
    """``file::Qualified.name`` of every public definition under ``root`` that has no docstring."""
    found: list[str] = []

    def visit(body: list[ast.stmt], rel: str, prefix: str) -> None:
        for node in body:
            if not isinstance(node, _DEFINITIONS) or node.name.startswith("_"):
                continue
            if ast.get_docstring(node) is None:
                found.append(f"{rel}::{prefix}{node.name}")
            if isinstance(node, ast.ClassDef):
                visit(node.body, rel, f"{prefix}{node.name}.")

    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)).body, rel, "")
    return found


def test_every_public_definition_has_a_docstring_except_the_known_ones():
    missing = set(missing_docstrings(SRC))
    new = sorted(missing - KNOWN_MISSING)
    assert not new, "public definition(s) without a docstring (add one, do not add it to KNOWN_MISSING):\n" + \
        "\n".join(new)
    gone = sorted(KNOWN_MISSING - missing)
    assert not gone, "documented (or removed) now, so remove from KNOWN_MISSING in tests/test_docstrings.py:\n" + \
        "\n".join(gone)


def test_the_walker_finds_what_lacks_a_docstring_and_skips_what_is_private(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text(
        '"""Module docstring (not a definition)."""\n'
        "def bare():\n    return 1\n\n"
        "def documented():\n    \"\"\"Yes.\"\"\"\n\n"
        "def _private():\n    pass\n\n"
        "async def fetch():\n    pass\n\n"
        "class Thing:\n"
        "    x: int = 0\n\n"
        "    @property\n    def size(self):\n        return 1\n\n"
        "    def _helper(self):\n        pass\n\n"
        "    class Inner:\n        \"\"\"Documented.\"\"\"\n        def go(self):\n            pass\n\n"
        "class _Hidden:\n    def public_but_hidden(self):\n        pass\n\n"
        "def outer():\n    \"\"\"Documented.\"\"\"\n    def nested():\n        pass\n    return nested\n"
    )
    (pkg / "sub").mkdir()
    (pkg / "sub" / "deep.py").write_text("class Deep:\n    pass\n")
    assert missing_docstrings(pkg) == [
        "mod.py::bare", "mod.py::fetch", "mod.py::Thing", "mod.py::Thing.size", "mod.py::Thing.Inner.go",
        "sub/deep.py::Deep",
    ]
