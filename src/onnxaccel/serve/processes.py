"""Process helpers the server, its worker processes and the model process share (Linux prctl), kept apart so
none of those modules imports another for them."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile


def die_with_parent(supervisor: int) -> None:
    """SIGTERM this worker when the supervisor dies (Linux prctl PR_SET_PDEATHSIG), so a killed supervisor
    leaves no worker holding the port and the GPU; the worker then drains like on any SIGTERM."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != supervisor:  # the supervisor died before prctl took effect (reparented)
        os.kill(os.getpid(), signal.SIGTERM)


def log_level(level: str) -> None:
    """At ``--log-level`` info or debug, onnxaccel's own messages (a model loaded, a padded size warm and in use)
    go to stderr too, with the time and the process's name; at warning and above Python's default already prints
    onnxaccel's warnings. Call it once per process (the server, each worker, the model process)."""
    import logging

    value = logging.getLevelName(level.upper())
    if not isinstance(value, int) or value > logging.INFO:
        return
    logger = logging.getLogger("onnxaccel")
    logger.setLevel(value)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(processName)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)


def name_process(name: str) -> None:
    """Name this process for ps, top and /proc/PID/comm (Linux prctl PR_SET_NAME, 15 bytes), so an operator
    (and benchmarks/serve_throughput.py's CPU breakdown) tells the model process from the decoding workers."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15])  # 15 = PR_SET_NAME


#: The file naming the supervisor that made a temporary folder; a later start removes the folder once that
#: process is gone (a SIGKILLed supervisor runs no cleanup of its own).
OWNER_FILE = "owner.pid"
STALE_PREFIXES = ("onnxaccel-metrics-", "onnxaccel-models-", "onnxaccel-shm-")


def owned_tempdir(prefix: str, where: str | None = None) -> str:
    """A private temporary folder with OWNER_FILE naming this process."""
    path = tempfile.mkdtemp(prefix=prefix, dir=where)
    with open(os.path.join(path, OWNER_FILE), "w") as out:
        out.write(str(os.getpid()))
    return path


def reap_stale_dirs(where: str | None = None) -> list[str]:
    """Remove the temporary folders of supervisors that died without cleaning up (this user's, whose owner pid
    no longer runs); the removed paths."""
    removed = []
    for root in {where or tempfile.gettempdir(), "/tmp"}:
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            path = os.path.join(root, name)
            if not name.startswith(STALE_PREFIXES) or not _owner_gone(path):
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _owner_gone(path: str) -> bool:
    try:
        if os.stat(path).st_uid != os.getuid():
            return False
        with open(os.path.join(path, OWNER_FILE)) as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
