#!/usr/bin/env python3
"""Check that only onnxaccel.providers (and engines/, which applies the options) names a provider's options.

    python scripts/check_provider_names.py     # exit 1 on a module outside ALLOWED that names one

A module "names" a provider when a string literal in its code (docstrings and comments do not count) holds an
option key from a registered provider's option table (as a whole word) or an ONNX Runtime provider name
("...ExecutionProvider"). Such a module holds a fact about one provider that belongs in its spec
(src/onnxaccel/providers/<device>.py), where every consumer reads it through the registry. ALLOWED lists the
modules that still do, each with the reason; an entry whose module no longer names anything is reported too,
so the list only shrinks.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "onnxaccel"
#: Packages that may name providers' options: the specs themselves, and the engines that apply them.
OWNERS = ("providers", "engines")
#: Option keys too generic to mean one provider (a report's "device_id" field is not the CUDA option).
GENERIC = frozenset({"device_id"})
UNPARSABLE = "<cannot parse>"
_PROVIDER_NAME = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z0-9]+ExecutionProvider(?![A-Za-z0-9_])")

#: Module (relative to src/onnxaccel) -> why it may still name provider options or names. Only shrinks.
ALLOWED: dict[str, str] = {}


def option_keys() -> frozenset[str]:
    """Every option key of every registered provider (table and newer keys), less the GENERIC ones."""
    try:  # the installed package; src/ only when none is (src/ first on sys.path hides the installed metadata)
        from onnxaccel import providers
    except ImportError:
        sys.path.insert(0, str(ROOT.parent))
        from onnxaccel import providers

    return frozenset(k for s in providers.all_specs() for k in s.all_options()) - GENERIC


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def names_in(source: str, keys: frozenset[str], filename: str = "<string>") -> set[str]:
    """The option keys and provider names that string literals in ``source``'s code hold."""
    tree = ast.parse(source, filename)
    skip = _docstrings(tree)
    words = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(map(re.escape, keys), key=len, reverse=True))
                       + r")(?![A-Za-z0-9_])") if keys else None
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found.update(_PROVIDER_NAME.findall(node.value))
            if words:
                found.update(words.findall(node.value))
    return found


def offenders(root: Path = ROOT, keys: frozenset[str] | None = None) -> dict[str, list[str]]:
    """Module (relative to ``root``) -> the provider names and option keys it names, outside OWNERS."""
    keys = option_keys() if keys is None else keys
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] in OWNERS:
            continue
        try:
            found = names_in(path.read_text(encoding="utf-8"), keys, str(path))
        except SyntaxError as exc:
            found = {f"{UNPARSABLE} ({exc.msg}, line {exc.lineno})"}
        if found:
            out[rel] = sorted(found)
    return out


def check(root: Path = ROOT, allowed: dict[str, str] | None = None, keys: frozenset[str] | None = None) -> list[str]:
    """Problems: modules naming providers outside ALLOWED, and ALLOWED entries that name nothing any more."""
    allowed = ALLOWED if allowed is None else allowed
    found = offenders(root, keys)
    problems = [f"{rel}: {names[0]}" for rel, names in found.items() if names[0].startswith(UNPARSABLE)]
    problems += [f"{rel}: names {', '.join(names)} (move it into its provider's spec in "
                 f"src/onnxaccel/providers/ and read it through the registry)"
                 for rel, names in found.items() if rel not in allowed and not names[0].startswith(UNPARSABLE)]
    problems += [f"{rel}: in ALLOWED but names no provider option or provider any more (remove it from ALLOWED)"
                 for rel in allowed if rel not in found]
    return problems


def main() -> int:
    problems = check()
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s)" if problems else "provider names stay in providers/ and engines/: ok",
          file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
