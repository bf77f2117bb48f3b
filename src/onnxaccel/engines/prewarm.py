"""Load a GPU provider's libraries in the background while a command starts.

On ONNX Runtime's CUDA provider most of a first run is not the model: the first ``Run`` of any session loads
cuDNN and cuBLAS (hundreds of MB of libraries) and their first kernels. A plain script pays that in its first
run; a command pays it after its own imports and model read. :func:`start` runs a session of a tiny model (one
FP16 Conv, one FP16 MatMul) once in a background thread, so the libraries load while the main thread imports,
reads the model and builds its session; the real first run then finds them loaded. The thread keeps no
session (its memory is freed with it), never fails the command (an error is only its span's detail), and a
command that ends first waits for it at exit (a native library must not be unloaded under a running thread).

It runs for providers whose spec has a ``prewarm`` (providers/cuda.py; measured: docs/BENCHMARKS.md
"Start-up"), with the options it names. ``ONNXACCEL_PREWARM=0`` turns it off (an A/B, or a GPU shared with a
process that must start first). The span ("provider warm-up") overlaps the other stages: the start-up report
gives wall times, never a sum of stages.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

from onnxaccel import startup

ENV = "ONNXACCEL_PREWARM"
#: At most this long a process about to exit waits for a warm-up still running.
EXIT_WAIT_S = 30.0

_started: dict[tuple, threading.Thread] = {}
_lock = threading.Lock()


def start(target) -> threading.Thread | None:
    """Start warming ``target``'s provider (a ``Target``) in a daemon thread, once per provider and options per
    process; None where it does not apply (off, a provider without ``prewarm``, or no target)."""
    if target is None or os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        spec = target.spec
        if spec.prewarm is None:
            return None
        given = target.provider_options()
    except (AttributeError, KeyError, ValueError):
        return None
    options = {k: str(v) for k, v in given.items() if k in spec.prewarm.copied}  # the rest (graph capture, a
    options.update(spec.prewarm.options)                                          # user's stream) is the real one's
    key = (spec.provider, tuple(sorted(options.items())))
    with _lock:
        if key in _started:
            return _started[key]
        thread = threading.Thread(target=_warm, args=(spec.provider, options), name="onnxaccel-prewarm",
                                  daemon=True)
        if not _started:
            atexit.register(wait, EXIT_WAIT_S)
        _started[key] = thread
    thread.start()
    return thread


def tiny_model(opset: int = 17):
    """The warm-up model: Conv of an FP16 [1,8,16,16] input (cuDNN) and MatMul of an FP16 [16,16] input by
    itself (cuBLAS); an ``onnx.ModelProto`` that passes the full checker."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.full((8, 8, 3, 3), 0.01, np.float16), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
         helper.make_node("MatMul", ["m", "m"], ["mm"])],
        "onnxaccel_prewarm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 8, 16, 16]),
         helper.make_tensor_value_info("m", TensorProto.FLOAT16, [16, 16])],
        [helper.make_tensor_value_info("conv", TensorProto.FLOAT16, [1, 8, 16, 16]),
         helper.make_tensor_value_info("mm", TensorProto.FLOAT16, [16, 16])],
        initializer=[weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8,
                             producer_name="onnxaccel")


def _warm(provider: str, options: dict[str, str]) -> None:
    with startup.stage("provider warm-up", detail=f"{provider}, a tiny session in the background") as span:
        try:
            import numpy as np
            import onnxruntime as ort

            if hasattr(ort, "preload_dlls"):  # as the real session does (engines/ort.py): CUDA/cuDNN from pip's
                with _quiet():                  # nvidia-* wheels; it prints on failure and never raises
                    ort.preload_dlls()
            if provider not in ort.get_available_providers():
                span.detail = f"skipped: {provider} is not in this onnxruntime build"
                return
            so = ort.SessionOptions()
            so.log_severity_level = 3
            so.intra_op_num_threads = 1
            session = ort.InferenceSession(tiny_model().SerializeToString(), so, providers=[(provider, options)])
            if session.get_providers()[0] != provider:
                span.detail = f"skipped: {provider} did not take the tiny model"
                return
            session.run(None, {"x": np.ones((1, 8, 16, 16), np.float16), "m": np.ones((16, 16), np.float16)})
        except Exception as exc:  # noqa: BLE001 - a warm-up never fails the command; the real session reports
            span.detail = f"failed (the command goes on): {type(exc).__name__}: {str(exc)[:200]}"


class _ThreadStdout:
    """sys.stdout for the time of the warm-up: this thread's writes are dropped, every other thread's go to the
    real stream (``contextlib.redirect_stdout`` would swap it for every thread, and a command's own output,
    e.g. its --json, could vanish)."""

    def __init__(self, real):
        self._real, self._thread = real, threading.get_ident()

    def write(self, text: str) -> int:
        return len(text) if threading.get_ident() == self._thread else self._real.write(text)

    def __getattr__(self, name: str):
        return getattr(self._real, name)


@contextlib.contextmanager
def _quiet():
    real = sys.stdout
    mine = _ThreadStdout(real)
    sys.stdout = mine
    try:
        yield
    finally:
        if sys.stdout is mine:  # another swap since (a redirect of the main thread's) keeps it: harmless there
            sys.stdout = real


def wait(timeout: float | None = None) -> None:
    """Wait for every warm-up this process started (a test, or a caller about to fork)."""
    with _lock:
        threads = list(_started.values())
    for thread in threads:
        thread.join(timeout)
