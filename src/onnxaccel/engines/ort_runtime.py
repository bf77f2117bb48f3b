"""The installed ONNX Runtime: importing it, its version and limits, its own log, and probing a provider.

Split from engines/ort.py (the engine and its runner); ``onnxaccel.engines.ort`` re-exports every public name
here, so callers keep importing from there.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
import tempfile
import threading
import warnings
from importlib import metadata

import onnx
from onnx import helper
from packaging.version import Version

from onnxaccel.engines.base import CPU, ProbeResult
from onnxaccel.engines.ort_ep_options import EpOptions, ep_environment, migraphx_options
from onnxaccel.engines.ort_errors import diagnose, first_error_line
from onnxaccel.engines.ort_flavour import installed_build
from onnxaccel.errors import MissingDependencyError, OnnxAccelError
from onnxaccel.target import Target

#: onnxruntime distributions that all install the same `onnxruntime` module (two of them conflict).
ORT_DISTRIBUTIONS = (
    "onnxruntime", "onnxruntime-gpu", "onnxruntime-migraphx", "onnxruntime-rocm", "onnxruntime-openvino",
    "onnxruntime-directml", "onnxruntime-qnn", "onnxruntime-training", "ort-nightly", "ort-nightly-gpu",
    "onnxruntime-cann", "onnxruntime-vitisai", "onnxruntime-silicon",
)


def import_ort():
    """Import onnxruntime, or say which extra installs it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "cpu", "Running models with ONNX Runtime") from exc
    return onnxruntime


def ort_version() -> Version:
    """The installed onnxruntime's version (a local suffix such as +rocm dropped)."""
    return Version(import_ort().__version__.split("+")[0])


def installed_distributions() -> dict[str, str]:
    """Every installed distribution that provides the `onnxruntime` module, with its version."""
    found = {}
    for name in ORT_DISTRIBUTIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


@functools.lru_cache(maxsize=1)
def runtime_limits() -> tuple[int, int]:
    """(max IR version, max ai.onnx opset) the installed runtime reads, learned from its own errors.

    ONNX Runtime answers a model stamped with an impossible version with "max supported IR version: N"
    and "Current official support for domain ai.onnx is till opset N" (seen on 1.31/1.32).
    """
    ort = import_ort()

    def probe(ir: int, opset: int) -> str:
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], "probe",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = ir
        try:
            ort.InferenceSession(model.SerializeToString(), providers=[CPU])
        except Exception as exc:  # noqa: BLE001 - we read the runtime's own message
            return str(exc)
        return ""

    ir_msg = probe(1000, 13)
    found = re.search(r"max supported IR version: (\d+)", ir_msg)
    max_ir = int(found.group(1)) if found else onnx.IR_VERSION
    op_msg = probe(7, 1000)
    found = re.search(r"ai\.onnx is till opset (\d+)", op_msg)
    max_opset = int(found.group(1)) if found else onnx.defs.onnx_opset_version()
    return max_ir, max_opset


# -- ONNX Runtime's own log -------------------------------------------------------------------------------
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
    def __init__(self):
        self.file = tempfile.TemporaryFile(mode="w+b")

    def text(self) -> str:
        self.file.seek(0)
        return self.file.read().decode(errors="replace")


@contextlib.contextmanager
def capture_native_stderr():
    """Capture what native code writes to file descriptor 2 (ONNX Runtime logs there).

    The text is kept for diagnosis (why a provider did not load), so while capturing, the default logger
    logs warnings even when the runtime log is quiet. The captured text is echoed to stderr afterwards only
    with --verbose or --debug."""
    global _capture_depth
    captured = _Captured()
    try:
        fd = os.dup(2)
    except OSError:  # no stderr at all
        yield captured
        return
    ort = sys.modules.get("onnxruntime")
    with _capture_lock:
        _capture_depth += 1
        if ort is not None and _capture_depth == 1:
            _apply_default_logger(ort, min(runtime_log_severity(), 2))
    try:
        sys.stderr.flush()
        os.dup2(captured.file.fileno(), 2)
        yield captured
    finally:
        os.dup2(fd, 2)
        os.close(fd)
        with _capture_lock:
            _capture_depth -= 1
            if ort is not None and _capture_depth == 0:
                _apply_default_logger(ort)
        if _runtime_log["level"] != "quiet":
            text = captured.text()
            if text:
                sys.stderr.write(text if text.endswith("\n") else text + "\n")
                sys.stderr.flush()


def probe_model() -> bytes:
    """A one-node ONNX model (Relu on a 1x4 float tensor) that every provider and MIGraphX can run: the
    probes build it to see whether a target really loads."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return model.SerializeToString()


def probe(target: Target) -> ProbeResult:
    """Build a one-node session on the target and look whether its provider stayed first.

    ``get_available_providers()`` only says how the wheel was built: onnxruntime-migraphx lists MIGraphX on
    machines without ROCm, and the CUDA EP logs an error and silently runs on the CPU (seen with onnxruntime-gpu
    1.31.1 on a host without CUDA: provider_bridge_ort.cc logs "Failed to load library ..."). Keeps the runtime's own words (``details``) and their translation (``cause``/``fix``).
    """
    ort = import_ort()
    if target.device in ("cuda", "tensorrt") and hasattr(ort, "preload_dlls"):
        # Loads CUDA/cuDNN from pip's nvidia-* wheels when present; prints, never raises (onnxruntime.preload_dlls in onnxruntime-gpu 1.31.1: prints "Failed to load ...", does not raise).
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
            ort.preload_dlls()
    try:
        ep = ep_options(target)
    except OnnxAccelError as exc:  # an option this build does not take: the target is not ready here
        return ProbeResult(False, [], exc.message, exc.hint)
    providers = [(target.provider, ep.options)]
    if target.provider != CPU:
        providers.append((CPU, {}))
    printed = io.StringIO()
    with capture_native_stderr() as log, contextlib.redirect_stdout(printed), ep_environment(ep.env), \
            warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            session = ort.InferenceSession(probe_model(), providers=providers, enable_fallback=0)
        except Exception as exc:  # noqa: BLE001 - the runtime's failure is the finding
            text = "\n".join([str(exc), log.text(), *(str(w.message) for w in warned)]).strip()
            found = diagnose(text)
            return ProbeResult(False, [], found.cause if found else first_error_line(str(exc)),
                               found.fix if found else None, text)
    actual = list(session.get_providers())
    text = "\n".join([log.text(), printed.getvalue(), *(str(w.message) for w in warned)]).strip()
    if actual and actual[0] == target.provider:
        return ProbeResult(True, actual, details=text or None)
    found = diagnose(text)
    cause = found.cause if found else (first_error_line(text) or f"{target.provider} was dropped without a reason")
    return ProbeResult(False, actual, cause, found.fix if found else None, text or None)


def ep_options(target: Target, proto: onnx.ModelProto | None = None) -> EpOptions:
    """The provider options of a session on ``target``, as the installed build takes them (MIGraphX: its
    spelling, its keys, its environment-only settings; engines/ort_ep_options.py), with notes."""
    if target.device == "migraphx":
        return migraphx_options(target, installed_build(), proto)
    return EpOptions(target.provider_options())


def probe_provider(target: Target) -> str | None:
    """None when the target's provider really loads here, else the translated reason it does not."""
    result = probe(target)
    return None if result.loaded else result.cause
