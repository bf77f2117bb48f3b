#!/usr/bin/env python3
"""Check that onnxaccel's imports flow one way and its modules stay short (docs/ARCHITECTURE.md, "Layers" and
"Rules the checks enforce").

    python scripts/check_imports.py            # exit 1 on an upward or sideways import, a cycle, a long module

Layers, top to bottom: cli -> features (bench, serve, loadtest, analysis, transform, system, scale, conformance)
-> compare, pipeline -> engines, precision -> the core (inputs, synthesis, model, then target, protobuf_values,
zoo, then errors, paths). A module may import its own package and anything in a lower layer. Features stay apart except
the pairs in ALLOWED. Every import counts, also the ones inside functions (they hide a dependency, not remove
it); `if TYPE_CHECKING:` imports do not. Cycles are reported between modules and between packages (module-level
imports only: a function-local import cannot make Python's import machinery loop, but it is still checked for
direction). For the package cycles, a top-level package ``onnxaccel.X`` imports what any of its modules imports,
and a top-level module is its own node. Every module under src/onnxaccel has at most MAX_LINES lines.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "onnxaccel"
PACKAGE = "onnxaccel"
#: The longest a module may be (docs/ARCHITECTURE.md, "Rules the checks enforce"): split a longer one along its
#: seams.
MAX_LINES = 450

#: Higher imports lower. The core is ordered too: errors/paths at the bottom, then the values that need only
#: those (target, protobuf_values, zoo), the model, synthesis, inputs.
LAYERS: dict[str, int] = {
    "errors": 1, "paths": 1, "install": 1, "__version__": 1, "startup": 1, "process_guard": 1,
    "target": 2, "providers": 2, "protobuf_values": 2, "zoo": 2,
    "model": 3, "model_shapes": 3, "model_data": 3, "model_memo": 2, "synthesis": 4, "image_geometry": 4, "inputs": 5, "inputs_files": 5, "feeds_check": 4, "prepost": 5, "calibration": 5,
    "engines": 6, "precision": 6,
    "compare": 7, "pipeline": 7, "plan": 7, "plan_types": 7, "plan_sizes": 7,
    "bench": 8, "serve": 8, "loadtest": 8, "analysis": 8, "transform": 8, "system": 8, "scale": 8,
    "conformance": 8,
    "cli": 9, "__main__": 9,
    "__init__": 10,  # the public API re-exports from everywhere
}
#: Layers whose members may not use each other (features stay apart); elsewhere a same-layer import is fine
#: when the checker finds no cycle (errors <-> paths, engines <-> precision are not features).
FEATURES = {"bench", "serve", "loadtest", "analysis", "transform", "system", "scale", "conformance"}

#: Feature -> features it may use (docs/ARCHITECTURE.md, "Layers": bench may use analysis and transform; bench, serve and scale the
#: telemetry sampler in system; scale may use serve; loadtest bench's statistics and serve's protocol, the wire format it speaks).
ALLOWED: dict[str, set[str]] = {
    "bench": {"analysis", "transform", "system"},
    "serve": {"system", "transform"},  # serve embeds an image preset into a model on GPU targets
    "scale": {"serve", "system", "transform"},  # transform: batch embeds the preprocessing its plan chose, as serve does
    "loadtest": {"bench", "serve"},  # bench's statistics; serve's protocol (the wire format it speaks)
    "conformance": set(),
}


def top(module: str) -> str:
    """'onnxaccel.engines.ort' -> 'engines'; 'onnxaccel' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported onnxaccel module, line, at module level) for every import of our own package in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path)
    is_package = path.name == "__init__.py"
    out = []
    type_checking: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_checking |= {id(n) for n in ast.walk(node)}
    top_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names if a.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            found = [target] if node.module or target != PACKAGE else [f"{target}.{a.name}" for a in node.names]
            if target == PACKAGE:
                found = [f"{PACKAGE}.{a.name}" for a in node.names]
        else:
            continue
        out += [(f, node.lineno, id(node) in top_level) for f in found]
    return out


def check() -> list[str]:
    """Every problem found under ROOT, one line each (``file:line: `` first where one import is to blame)."""
    problems = []
    graph: dict[str, set[str]] = defaultdict(set)
    #: Top-level package (or module) -> those it imports at module level, with the first import that does.
    packages: dict[str, dict[str, str]] = defaultdict(dict)
    files = sorted(ROOT.rglob("*.py"))
    known = {module_name(p) for p in files}
    for path in files:
        src = module_name(path)
        a = top(src)
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            problems.append(f"module too long: {path.relative_to(ROOT.parent.parent)} {lines} lines "
                            f"(at most {MAX_LINES})")
        for target, line, module_level in imports(path):
            b = top(target)
            where = f"{path.relative_to(ROOT.parent.parent)}:{line}"
            if module_level and a != b:
                packages[a].setdefault(b, f"{src} -> {target}")  # no line: KNOWN entries must not move
            if a == b or b == "__init__" and target == PACKAGE and a == "__init__":
                pass
            elif a not in LAYERS or b not in LAYERS:
                problems.append(f"{where}: {src} -> {target}: module not placed in a layer (add it to LAYERS)")
            elif LAYERS[b] > LAYERS[a]:
                problems.append(f"{where}: upward import {src} -> {target}")
            elif LAYERS[b] == LAYERS[a] and a in FEATURES and b not in ALLOWED.get(a, set()):
                problems.append(f"{where}: sideways import {src} -> {target} ({a} may not use {b})")
            if module_level:
                resolved = target
                while resolved not in known and "." in resolved:
                    resolved = resolved.rsplit(".", 1)[0]
                if resolved != src:
                    graph[src].add(resolved)
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    for cycle in cycles({a: set(b) for a, b in packages.items()}):
        members = set(cycle)
        via = "; ".join(packages[a][b] for a in sorted(members) for b in sorted(packages[a]) if b in members)
        problems.append(f"package cycle: {' -> '.join(_qualified(c) for c in cycle)} ({via})")
    return problems


def _qualified(name: str) -> str:
    """A top-level name as a module path: 'prepost' -> 'onnxaccel.prepost', '__init__' -> 'onnxaccel'."""
    return PACKAGE if name == "__init__" else f"{PACKAGE}.{name}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node (Tarjan): its members sorted, the first
    again at the end."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component) + [sorted(component)[0]])

    sys.setrecursionlimit(10000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main() -> int:
    problems = check()
    for problem in problems:
        print(problem)
    print(f"{len(problems)} import problem(s)" if problems else "imports flow one way: ok", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
