"""Is the native MIGraphX engine usable here? A one-node program compiled and run on the engine's target.

NOT EXECUTED ON AMD HARDWARE: the tests run this against the reference-target build (scripts/build-migraphx-ref)
and the stand-in module; the "gpu" target path has never run on a real AMD GPU.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from onnxaccel.engines.base import ProbeResult
from onnxaccel.engines.migraphx_errors import missing_target, short_message
from onnxaccel.engines.migraphx_setup import (
    NATIVE, MigraphxNotInstalledError, import_migraphx, migraphx_target_name, migraphx_version,
)
from onnxaccel.engines.ort_errors import diagnose
from onnxaccel.engines.ort_runtime import probe_model
from onnxaccel.errors import TargetError
from onnxaccel.target import Target


def probe(target: Target | None = None) -> ProbeResult:
    """Compile and run a one-node program on the GPU (or on the target ONNXACCEL_MIGRAPHX_TARGET names):
    is the native engine usable here?

    Returns a :class:`ProbeResult`, like the ONNX Runtime probe, so ``doctor`` can show both alike."""
    try:
        mgx = import_migraphx()
    except MigraphxNotInstalledError as exc:
        return ProbeResult(False, [], exc.message, exc.hint, exc.details)
    try:
        name = migraphx_target_name()
    except TargetError as exc:
        return ProbeResult(False, [], exc.message, exc.hint)
    x = np.array([[-1.0, 0.0, 2.0, -3.5]], dtype=np.float32)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "probe.onnx"
            path.write_bytes(probe_model())
            prog = mgx.parse_onnx(str(path), map_input_dims={"x": [1, 4]})
            prog.compile(mgx.get_target(name))
            y = np.array(prog.run({"x": x})[0])
    except Exception as exc:  # noqa: BLE001 - MIGraphX's failure is the finding
        missing = missing_target(str(exc), name)
        if missing is not None:
            return ProbeResult(False, [], missing.message, missing.hint, str(exc))
        found = diagnose(str(exc))
        return ProbeResult(False, [], found.cause if found else short_message(str(exc)),
                           found.fix if found else "Run `rocminfo` and check docs/AMD.md.", str(exc))
    if not np.array_equal(y, np.maximum(x, 0)):
        return ProbeResult(False, [NATIVE], f"a one-node program gave wrong results on the MIGraphX {name} target",
                           "Check the ROCm install (docs/AMD.md: one release for every component).", repr(y))
    return ProbeResult(True, [NATIVE], details=f"migraphx {migraphx_version(mgx)}, target {name}")
