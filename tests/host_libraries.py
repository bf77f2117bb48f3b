"""Which shared libraries load on this host (CUDA, HIP runtimes): tests skip or expect refusals by it."""

from __future__ import annotations

import ctypes


def library_loads(name: str) -> bool:
    """Whether ``ctypes`` can load the shared library ``name`` here."""
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True
