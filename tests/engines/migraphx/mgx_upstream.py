"""Read the vendored MIGraphX snippets (upstream/mgx_*.txt) and the binding signatures they quote.

Each snippet starts with ``# REPO PATH @ COMMIT``, a comment line, then runs of exact upstream lines, each run
introduced by ``@@ N`` (the run begins at line N of that file). ``signatures`` reads pybind11 ``def`` calls
out of the quoted C++: the Python name, and each ``py::arg("name") = default`` in order.
"""

from __future__ import annotations

import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE / "upstream"
REPO_ROOT = HERE.parents[2]


@dataclass(frozen=True)
class Snippet:
    repo: str
    path: str
    commit: str
    runs: tuple[tuple[int, tuple[str, ...]], ...]

    @property
    def text(self) -> str:
        return "\n".join(line for _, lines in self.runs for line in lines)


def read_snippet(name: str) -> Snippet:
    lines = (UPSTREAM / name).read_text().splitlines()
    head = re.fullmatch(r"# (\S+) (\S+) @ ([0-9a-f]{40})\b.*", lines[0])
    if not head:
        raise ValueError(f"{name}: the first line must be '# REPO PATH @ COMMIT'")
    runs, start, current = [], None, []
    for line in lines[2:]:
        marker = re.fullmatch(r"@@ (\d+)", line)
        if marker:
            if start is not None:
                runs.append((start, tuple(current)))
            start, current = int(marker.group(1)), []
        else:
            current.append(line)
    if start is not None:
        runs.append((start, tuple(current)))
    return Snippet(head.group(1), head.group(2), head.group(3), tuple(runs))


def upstream_file(snippet: Snippet) -> str | None:
    """The quoted file at the snippet's commit, from the vendored source archive (../shared/vendor, or the
    archive or checkout ONNXACCEL_MIGRAPHX_SOURCE names), or None where it is not here."""
    if snippet.repo != "ROCm/AMDMIGraphX":
        return None
    given = os.environ.get("ONNXACCEL_MIGRAPHX_SOURCE")
    candidates = [Path(given)] if given else []
    candidates.append(REPO_ROOT.parent / "shared" / "vendor" / f"AMDMIGraphX-{snippet.commit[:7]}.tar.gz")
    for source in candidates:
        if source.is_dir() and (source / snippet.path).is_file():
            return (source / snippet.path).read_text()
        if source.is_file() and snippet.commit[:7] in source.name:
            with tarfile.open(source) as archive:
                for member in archive.getmembers():
                    if member.name.split("/", 1)[-1] == snippet.path:
                        return archive.extractfile(member).read().decode()
    return None


_DEF = re.compile(r'(?:m\.def|\.def|\.def_static)\(\s*"(\w+)"')
_ARG = re.compile(r'py::arg\("(\w+)"\)')


def signatures(text: str) -> dict[str, list[tuple[str, str | None]]]:
    """``{python name: [(argument, C++ default or None), ...]}`` for every pybind11 def in ``text``."""
    starts = [(m.start(), m.group(1)) for m in _DEF.finditer(text)]
    found = {}
    for i, (pos, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        body = text[pos:end]
        args = []
        for arg in _ARG.finditer(body):
            args.append((arg.group(1), _default_after(body, arg.end())))
        found[name] = args
    return found


def _default_after(text: str, pos: int) -> str | None:
    rest = text[pos:].lstrip()
    if not rest.startswith("="):
        return None
    rest, depth, out = rest[1:].lstrip(), 0, []
    for ch in rest:
        if depth == 0 and ch in ",)" and out:
            break
        depth += ch in "(<{"
        depth -= ch in ")>}"
        out.append(ch)
    return re.sub(r"\s+", " ", "".join(out)).strip()


EMPTY = "<empty container>"
DYN_1_1 = "<dynamic_dimension{1, 1}>"


def python_default(cpp: str):
    """The value a C++ default stands for, as a Python value (or EMPTY / DYN_1_1 markers)."""
    if cpp in ("true", "false"):
        return cpp == "true"
    if re.fullmatch(r"-?\d+", cpp):
        return int(cpp)
    if re.fullmatch(r'"[^"]*"', cpp):
        return cpp[1:-1]
    if cpp == "std::numeric_limits<uint16_t>::max()":
        return 65535
    if cpp == "migraphx::shape::dynamic_dimension{1, 1}":
        return DYN_1_1
    container = re.fullmatch(r"std::(vector|unordered_set|unordered_map)<.*?>\s*(?:\{(.*)\}|\(\))", cpp)
    if container:
        items = re.findall(r'"([^"]*)"', container.group(2) or "")
        if not items:
            return EMPTY
        return set(items) if container.group(1) == "unordered_set" else items
    raise ValueError(f"no Python reading for the C++ default {cpp!r}")
