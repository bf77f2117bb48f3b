"""How much of ONNX Runtime's own log reaches stderr, and capturing what it writes there (its loggers write to
file descriptor 2). Apart from engines/ort_runtime.py so that the command line can set the level (--verbose,
--debug) before any command runs without importing ONNX Runtime, onnx or numpy: this module imports none of them
and acts on ``onnxruntime`` only where it is imported already."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading

# ONNX Runtime writes its log lines ("[W:onnxruntime:...]", "[E:onnxruntime:...]", ANSI-coloured) to file
# descriptor 2, from two loggers: each session's (severity from SessionOptions.log_severity_level, fixed at
# creation and inherited by its runs) and the process-wide default logger (set_default_logger_severity; used
# while providers are created and by some kernels). Severities: 0 verbose, 1 info, 2 warning, 3 error,
# 4 fatal (microsoft/onnxruntime include/onnxruntime/core/common/logging/severity.h, 1.32).

#: How much of the runtime's log reaches stderr, by level: "quiet" (nothing: failures reach the user as our
#: own errors, with the runtime's text in their details), "verbose" (warnings and errors), "debug" (all).
RUNTIME_LOG_SEVERITY = {"quiet": 4, "verbose": 2, "debug": 0}
_runtime_log = {"level": "quiet", "explicit": False, "applied": None}
_capture_lock = threading.Lock()
_capture_depth = 0


def set_runtime_log_level(level: str) -> None:
    """Choose how much of ONNX Runtime's own log reaches stderr ("quiet", "verbose" or "debug"); the CLI calls
    this from --verbose/--debug. Sessions built afterwards use it, and so does the process-wide default logger
    (which is left alone until this is called)."""
    if level not in RUNTIME_LOG_SEVERITY:
        raise ValueError(f"runtime log level must be one of {', '.join(RUNTIME_LOG_SEVERITY)}, not {level!r}")
    _runtime_log.update(level=level, explicit=True)
    ort = sys.modules.get("onnxruntime")
    if ort is not None:
        _apply_default_logger(ort)


def runtime_log_level() -> str:
    """The level set by set_runtime_log_level ("quiet" until the CLI says otherwise)."""
    return _runtime_log["level"]


def runtime_log_severity() -> int:
    """The ONNX Runtime severity for sessions: 4 (fatal only) unless --verbose (2) or --debug (0)."""
    return RUNTIME_LOG_SEVERITY[_runtime_log["level"]]


def _apply_default_logger(ort, severity: int | None = None) -> None:
    if not _runtime_log["explicit"]:
        return
    if severity is None and _capture_depth > 0:
        return  # a capture has opened the default logger to warnings: keep it so until the capture ends
    severity = runtime_log_severity() if severity is None else severity
    if _runtime_log["applied"] != severity and hasattr(ort, "set_default_logger_severity"):
        ort.set_default_logger_severity(severity)
        _runtime_log["applied"] = severity


class _Captured:
    """What native code wrote to file descriptor 2 during one capture: the shared file from ``start`` on."""

    def __init__(self, file, start: int):
        self.file, self.start, self.end = file, start, None

    def text(self) -> str:
        with _capture_lock:
            end = self.end if self.end is not None else os.lseek(self.file.fileno(), 0, os.SEEK_END)
            return os.pread(self.file.fileno(), max(0, end - self.start), self.start).decode(errors="replace")


#: While captures are open: the saved descriptor 2 and the one file they all write to. Captures overlap when
#: instances build sessions side by side (engines/pool_warm.py); each dup2-ing and restoring fd 2 on its own left
#: it pointing at a closed capture's file once they ended out of order (the process's stderr was lost).
_shared: dict = {}


@contextlib.contextmanager
def capture_native_stderr():
    """Capture what native code writes to file descriptor 2 (ONNX Runtime logs there).

    The text is kept for diagnosis (why a provider did not load), so while capturing, the default logger
    logs warnings even when the runtime log is quiet. The captured text is echoed to stderr afterwards only
    with --verbose or --debug. Captures in several threads at once share one redirect: the first redirects fd 2,
    the last restores it; each gets what was written while it was open (others' lines included)."""
    global _capture_depth
    ort = sys.modules.get("onnxruntime")
    with _capture_lock:
        if _capture_depth == 0:
            try:
                saved = os.dup(2)
            except OSError:  # no stderr at all
                saved = None
            file = tempfile.TemporaryFile(mode="w+b")
            sys.stderr.flush()
            if saved is not None:
                os.dup2(file.fileno(), 2)
            _shared.update(saved=saved, file=file)
            if ort is not None:
                _apply_default_logger(ort, min(runtime_log_severity(), 2))
        _capture_depth += 1
        captured = _Captured(_shared["file"], os.lseek(_shared["file"].fileno(), 0, os.SEEK_END))
    try:
        yield captured
    finally:
        with _capture_lock:
            sys.stderr.flush()
            captured.end = os.lseek(captured.file.fileno(), 0, os.SEEK_END)
            _capture_depth -= 1
            if _capture_depth == 0:
                saved = _shared.pop("saved")
                _shared.pop("file")  # each capture keeps its own reference for text()
                if saved is not None:
                    os.dup2(saved, 2)
                    os.close(saved)
                if ort is not None:
                    _apply_default_logger(ort)
        if _runtime_log["level"] != "quiet":
            text = captured.text()
            if text:
                sys.stderr.write(text if text.endswith("\n") else text + "\n")
                sys.stderr.flush()
