"""A process's descendants, read from /proc (no psutil here), and a wait for them to end: tests that kill a
command check that it leaves no process behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def _parents() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])  # comm may hold spaces
    return parents


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (children, their children, ...)."""
    parents, found, todo = _parents(), set(), [pid]
    while todo:
        above = todo.pop()
        below = [child for child, parent in parents.items() if parent == above]
        found.update(below)
        todo.extend(below)
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def survivors(pids: set[int], within: float = 15.0) -> set[int]:
    """The processes of ``pids`` still running after ``within`` seconds. They are then SIGKILLed, so a failing
    test leaves nothing behind either: workers first, then, once those are gone, any multiprocessing resource
    tracker left (it ignores SIGTERM, and unlinks the run's semaphores and shared memory when it ends on its
    own)."""
    left = _wait(pids, within)
    workers = {pid for pid in left if "resource_tracker" not in _cmdline(pid)}
    _kill(workers)
    _kill(_wait(left - workers, 5.0))
    return left


def _wait(pids: set[int], within: float) -> set[int]:
    deadline = time.monotonic() + within
    left = {pid for pid in pids if alive(pid)}
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = {pid for pid in left if alive(pid)}
    return left


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _kill(pids: set[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
