"""Process helpers the server, its worker processes and the model process share (Linux prctl), kept apart so
none of those modules imports another for them."""

from __future__ import annotations

import contextlib
import os
import signal


def die_with_parent(supervisor: int) -> None:
    """SIGTERM this worker when the supervisor dies (Linux prctl PR_SET_PDEATHSIG), so a killed supervisor
    leaves no worker holding the port and the GPU; the worker then drains like on any SIGTERM."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != supervisor:  # the supervisor died before prctl took effect (reparented)
        os.kill(os.getpid(), signal.SIGTERM)


def name_process(name: str) -> None:
    """Name this process for ps, top and /proc/PID/comm (Linux prctl PR_SET_NAME, 15 bytes), so an operator
    (and benchmarks/serve_throughput.py's CPU breakdown) tells the model process from the decoding workers."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15])  # 15 = PR_SET_NAME
