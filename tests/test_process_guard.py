"""Pool workers end with their parent, however it ends (onnxaccel/process_guard.py): a SIGKILLed parent's
ProcessPoolExecutor workers otherwise wait on their call queue forever, parented to init. Real processes,
killed for real, for both start methods the package uses (spawn: batch's decode pool; fork: loadtest)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from tests.process_tree import descendants, survivors

PARENT = textwrap.dedent("""
    import multiprocessing, os, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from onnxaccel.process_guard import exit_with_parent

    if __name__ == "__main__":
        guard = exit_with_parent if sys.argv[2] == "guarded" else None
        pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context(sys.argv[1]), initializer=guard)
        pids = {f.result() for f in [pool.submit(os.getpid) for _ in range(8)]}
        print(" ".join(map(str, sorted(pids))), flush=True)
        time.sleep(600)
""")


def _kill_parent_holding_a_pool(tmp_path, method: str, mode: str) -> tuple[set[int], set[int]]:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(script), method, mode], stdout=subprocess.PIPE, text=True)
    try:
        workers = {int(pid) for pid in proc.stdout.readline().split()}
        assert workers, "the pool answered no task"
        below = descendants(proc.pid)  # the workers, any it started but gave no task, the resource tracker
        assert workers <= below
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return workers, survivors(below, within=5.0 if mode == "unguarded" else 15.0)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_workers_end_when_their_parent_is_killed(tmp_path, method):
    workers, left = _kill_parent_holding_a_pool(tmp_path, method, "guarded")
    assert left == set(), f"{method} workers {sorted(left)} outlived their SIGKILLed parent"


def test_without_the_guard_the_workers_outlive_their_parent(tmp_path):
    """The mechanism the guard exists for, shown on this Python: unguarded spawn workers are still running."""
    workers, left = _kill_parent_holding_a_pool(tmp_path, "spawn", "unguarded")
    assert workers <= left
