"""The README's Use examples that run on a CPU, run as a user from a fresh clone would (issue 23).

Every ```bash block of the README's "## Use" section runs as one bash script (``set -e``), in order, in
one temporary folder (a later block uses what an earlier one wrote, as a reader would), with this venv's
``onnxaccel`` first on PATH, on loopback only; a block after an ``<!-- gpu -->`` comment needs a GPU and is
skipped. Each block must exit 0 within its time limit. The
server block's port 8000 is replaced by a free port so that parallel test runs do not collide, and its
background server is killed however the block ends.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"(<!-- *gpu *-->\s*)?```bash\n(.*?)```", re.S)


def use_section() -> str:
    text = README.read_text()
    start = text.index("\n## Use\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def cpu_blocks() -> list[str]:
    return [m.group(2) for m in BLOCK.finditer(use_section()) if not m.group(1)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_use_section_has_cpu_and_gpu_examples():
    blocks = cpu_blocks()
    assert len(blocks) >= 2 and any("onnxaccel serve" in b for b in blocks)
    assert "<!-- gpu -->" in use_section()
    commands = {line.split()[1] for b in blocks for line in b.splitlines() if line.startswith("onnxaccel ")}
    assert {"doctor", "run", "inspect", "bench", "compare", "profile", "optimize", "serve", "loadtest"} <= commands


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readme")


@pytest.mark.parametrize("index", range(len(cpu_blocks())))
def test_readme_cpu_example_block_exits_0(index, workdir):
    script = cpu_blocks()[index].replace("8000", str(free_port()))
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "COLUMNS": "80",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    # kill the block's background jobs (the server) however it ends
    wrapped = "set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + script
    proc = subprocess.run(["bash", "-c", wrapped], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, f"block {index} failed:\n{script}\n--- stdout\n{proc.stdout[-4000:]}\n" \
                                 f"--- stderr\n{proc.stderr[-4000:]}"
