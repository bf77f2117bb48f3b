"""How this process got its runners: sessions built, programs compiled, programs loaded from saved artifacts.

Start-up is mostly compiling (ONNX Runtime's graph optimizer and its providers' compilers, MIGraphX's own), and
the point of ``onnxaccel compile`` is that a start from its directory compiles nothing. These counts say whether
that held: a test asserts ``compiled == 0`` after a start from an artifacts directory, and a start-up report can
show them. What counts:

* ``sessions``: runners built through the pipeline (``pipeline.RunnerFromVariant``, every command's path).
* ``compiled``: an ONNX Runtime session built from a model the optimizer and the provider still had to
  process, or a native MIGraphX program parsed and compiled (engines/migraphx.py, one per input shape).
* ``loaded``: an ONNX Runtime session built from a saved artifact (an optimized model, a provider's saved
  programs), or a native MIGraphX program read back with ``migraphx.load``.

Counts are per process (a server's model process counts its own) and thread-safe.
"""

from __future__ import annotations

import threading
from collections import Counter

_LOCK = threading.Lock()
_COUNTS: Counter[str] = Counter()
FIELDS = ("sessions", "compiled", "loaded")


def count_session(engine: str, *, loaded: bool) -> None:
    """One runner built: a session, and for the ONNX Runtime engine a program compiled or loaded (the native
    MIGraphX engine counts its programs itself, one per shape, with :func:`count_program`)."""
    with _LOCK:
        _COUNTS["sessions"] += 1
        if engine == "ort":
            _COUNTS["loaded" if loaded else "compiled"] += 1


def count_program(*, loaded: bool) -> None:
    """One native MIGraphX program: compiled, or loaded from a saved ``.mxr``."""
    with _LOCK:
        _COUNTS["loaded" if loaded else "compiled"] += 1


def build_counts() -> dict[str, int]:
    """``{"sessions": n, "compiled": n, "loaded": n}`` for this process so far."""
    with _LOCK:
        return {name: _COUNTS[name] for name in FIELDS}


def reset_build_counts() -> dict[str, int]:
    """Set the counts back to zero (a test, or a report that measures one phase); returns them as they were."""
    with _LOCK:
        before = {name: _COUNTS[name] for name in FIELDS}
        _COUNTS.clear()
        return before
