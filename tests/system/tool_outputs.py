"""Real tool outputs (fixtures/, each citing its source) and stand-ins for the vendors' tools that print them.

A stand-in is a tiny shell script on PATH named like the tool (``rocminfo``, ``rocm-smi``); it prints a
fixture verbatim, so the code under test runs its real subprocess, parsing and merging paths on output a
real GPU produced. Hardware that cannot exist here is the only thing replaced.
"""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
MARKER = "# ---\n"


def fixture_text(name: str) -> str:
    """The tool's output: the fixture without our citation header (everything after the '# ---' line)."""
    text = (FIXTURES / name).read_text()
    assert MARKER in text, f"{name} has no '# ---' line after its source citation"
    return text.split(MARKER, 1)[1]


def write_tool(bin_dir: Path, tool: str, *outputs: str, exit_code: int = 0, after: int | None = None,
               late_exit: int = 1) -> Path:
    """A script named ``tool`` that prints the fixtures ``outputs`` in turn (one per call, the last repeating).

    With ``after=N`` the calls after the N-th exit with ``late_exit`` and print nothing (a tool that breaks).
    """
    bin_dir.mkdir(parents=True, exist_ok=True)
    bodies = []
    for i, name in enumerate(outputs):
        body = bin_dir / f".{tool}.{i}.out"
        body.write_text(fixture_text(name))
        bodies.append(body)
    counter = bin_dir / f".{tool}.count"
    counter.write_text("0")
    script = bin_dir / tool
    cases = "\n".join(f"  {i}) cat '{b}';;" for i, b in enumerate(bodies[:-1]))
    broken = f'if [ "$n" -ge {after} ]; then exit {late_exit}; fi' if after is not None else ""
    script.write_text(f"""#!/bin/sh
n=$(cat '{counter}'); echo $((n + 1)) > '{counter}'
{broken}
case "$n" in
{cases}
  *) cat '{bodies[-1]}';;
esac
exit {exit_code}
""")
    script.chmod(0o755)
    return script


UPSTREAM = Path(__file__).parent / "upstream"


def upstream(name: str) -> tuple[str, str]:
    """(source, text) of a vendored excerpt of upstream source: its first line names repository, path and
    commit; the rest is quoted verbatim, in blocks headed ``# --- lines A-B``."""
    source, _, text = (UPSTREAM / name).read_text().partition("\n")
    assert " @ " in source and len(source.split(" @ ")[1].split()[0]) == 40, f"{name}: no commit in {source!r}"
    return source.lstrip("# "), text


def rocm_smi_note() -> str:
    """How the rocm-smi backend's note starts on a machine without an AMD GPU: Debian's rocm-smi says the
    driver is missing where it is installed (the CI machine), else the tool is not found."""
    return "rocm-smi: no AMD GPU visible" if shutil.which("rocm-smi") else "rocm-smi: rocm-smi not found"
