"""Start-up and crash hygiene of multi-process servers on loopback: a repository whose every model fails to load
stops `--workers N` and `--shared-models` with exit 2 (as a single server does) unless --allow-unavailable, and
the temporary folders of a SIGKILLed supervisor are removed by the next start (issue 21 item 9, issue 20)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import make_mlp
from tests.serve.conftest import SERVE, ServerProcess


@pytest.mark.parametrize("mode", [["--workers", "2"], ["--workers", "2", "--shared-models"]])
def test_every_model_failing_stops_a_multi_process_server(tmp_path, mode):
    repo = tmp_path / "repo"
    (repo / "broken").mkdir(parents=True)
    (repo / "broken" / "model.onnx").write_bytes(b"this is not an onnx model")
    proc = subprocess.run([sys.executable, "-c", SERVE, "serve", str(repo), "--target", "cpu", *mode,
                           "--http-port", "0", "--grpc-port", "0"], capture_output=True, text=True, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "No model could be loaded" in text and "broken" in text and "--allow-unavailable" in text
    assert "Traceback" not in text


def _owned_by(pid: int, tmp: Path) -> list[Path]:
    """The server folders in ``tmp`` and /tmp (the socket folder falls back there when TMPDIR is long) that
    process ``pid`` made."""
    found = []
    for root in (tmp, Path("/tmp")):
        for path in root.iterdir():
            owner = path / "owner.pid"
            if path.name.startswith(("onnxaccel-models-", "onnxaccel-metrics-")) and owner.exists() \
                    and owner.read_text().strip() == str(pid):
                found.append(path)
    return sorted(found)


def _wait_gone(pids: list[int], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists()
                 and "zombie" not in Path(f"/proc/{p}/status").read_text()]
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"still running: {alive}")


def test_the_next_start_removes_what_a_sigkilled_supervisor_left(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    make_mlp(tmp_path / "mlp.onnx")
    args = ("--workers", "2", "--shared-models", "--no-grpc")
    first = ServerProcess(tmp_path / "mlp.onnx", *args, log=tmp_path / "first.log",
                          env={"TMPDIR": str(tmp)}).wait_ready(120)
    children = [int(p) for p in Path(f"/proc/{first.proc.pid}/task/{first.proc.pid}/children").read_text().split()]
    first.proc.kill()
    first.proc.wait()
    first.stop()
    _wait_gone(children)
    left = _owned_by(first.proc.pid, tmp)
    assert len(left) == 2, left  # what the killed supervisor could not remove (metrics and socket folders)

    second = ServerProcess(tmp_path / "mlp.onnx", *args, log=tmp_path / "second.log",
                           env={"TMPDIR": str(tmp)}).wait_ready(120)
    try:
        assert not any(path.exists() for path in left), left
        assert len(_owned_by(second.proc.pid, tmp)) == 2  # the second server's own
    finally:
        assert second.stop() == 0, second.log()
    assert _owned_by(second.proc.pid, tmp) == []
