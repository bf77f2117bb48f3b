"""The installed ONNX Runtime: importing it, its version and limits, its own log (engines/ort_log.py), and
probing a provider.

Split from engines/ort.py (the engine and its runner); ``onnxaccel.engines.ort`` re-exports every public name
here, so callers keep importing from there.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import warnings
from importlib import metadata

import onnx
from onnx import helper
from packaging.version import Version

from onnxaccel.engines.base import CPU, ProbeResult
from onnxaccel.engines.ort_ep_options import EpOptions, ep_environment, migraphx_options
from onnxaccel.engines.ort_errors import diagnose, first_error_line
from onnxaccel.engines.ort_flavour import installed_build
from onnxaccel.engines.ort_log import (  # noqa: F401 - re-exported: engines/ort.py names them from here
    RUNTIME_LOG_SEVERITY, _apply_default_logger, capture_native_stderr, runtime_log_level, runtime_log_severity,
    set_runtime_log_level,
)
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
