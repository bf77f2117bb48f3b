"""Precision by MIGraphX's own quantization passes, and the INT8 calibration data they read.

``quantize_fp16`` / ``quantize_bf16`` / ``quantize_int8`` run on the parsed program, before ``compile``
(ROCm/AMDMIGraphX src/py/migraphx_py.cpp). INT8 calibrates on samples: the ones given to
``MigraphxEngine.compile``, else the target's ``calibration=`` option read by the loaders ``onnxaccel optimize``
uses, else synthetic data (flagged). Split from engines/migraphx.py.

NOT EXECUTED ON AMD HARDWARE: FP16 and INT8 quantization run in the tests on the real reference-target build
(on the CPU); bf16 and the GPU target's quantized kernels have never run here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from onnxaccel.calibration import SYNTHETIC_WARNING, load_calibration
from onnxaccel.engines.migraphx_cache import calibration_fingerprint
from onnxaccel.engines.migraphx_errors import short_message
from onnxaccel.engines.migraphx_program import HostArguments, rebatch
from onnxaccel.engines.migraphx_setup import NativeOptions
from onnxaccel.errors import InferenceError, InputError, OnnxAccelError, TargetError
from onnxaccel.model import Model

Samples = list[dict[str, np.ndarray]]


def calibration_id(precision: str, given: Sequence[Mapping[str, np.ndarray]] | None,
                   options: NativeOptions) -> str | None:
    """What the INT8 calibration data is, for the program cache key: a digest of the given samples, or the
    fingerprint of the ``calibration=`` source; None for other precisions (calibration changes nothing)."""
    if precision != "int8":
        return None
    if given is not None:
        digest = hashlib.sha256()
        for sample in given:
            for name in sorted(sample):
                value = np.ascontiguousarray(sample[name])
                digest.update(f"{name}{value.dtype}{value.shape}".encode())
                digest.update(value.tobytes())
        return "given:" + digest.hexdigest()[:20]
    try:
        return calibration_fingerprint(options.calibration, options.calibration_samples)
    except OSError as exc:
        raise InputError(f"Calibration data not found: {options.calibration}",
                         "Give calibration=DIR_OF_IMAGES, FILE.npz, FILE.npy or synthetic.") from exc


def load_samples(options: NativeOptions, model: Model, warnings: list[str]) -> Samples:
    """The samples the target's ``calibration=`` option names (synthetic without one: a warning says so)."""
    # The loaders `onnxaccel optimize` uses (core: onnxaccel.calibration reads feeds like inputs).

    data = load_calibration(options.calibration or "synthetic", model, max_samples=options.calibration_samples)
    if data.synthetic:
        warnings.append(SYNTHETIC_WARNING)
    return data.samples


def quantize(mgx, prog, precision: str, shapes: dict[str, tuple[int, ...]], *, version: str, source: str,
             target: Callable[[], object], samples: Callable[[], Samples]) -> None:
    """Quantize the parsed ``prog`` to ``precision`` in place; fp32 leaves it as parsed.

    ``target`` and ``samples`` are called only for INT8 (the compile target and the calibration samples)."""
    try:
        if precision == "fp16":
            mgx.quantize_fp16(prog)
        elif precision == "bf16":
            if not hasattr(mgx, "quantize_bf16"):
                raise TargetError(f"MIGraphX {version} has no quantize_bf16.",
                                  "Use a newer ROCm/MIGraphX release, or /fp16.")
            mgx.quantize_bf16(prog)
        elif precision == "int8":
            held = [HostArguments(mgx, rebatch(s, shapes)) for s in samples()]
            # ins_names stays at its default {"dot", "convolution"}: newer MIGraphX accepts exactly that set
            # ("QUANTIZE_INT8: only support DOT and CONVOLUTION operation", src/quantization.cpp).
            mgx.quantize_int8(prog, target(), calibration=[h.arguments for h in held])
            del held  # the buffers may go only now: quantize_int8 has read them
    except OnnxAccelError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise InferenceError(f"MIGraphX could not quantize {source} to {precision}: {short_message(str(exc))}",
                             "Try another precision, or run --target migraphx (ONNX Runtime's EP) to compare.",
                             details=str(exc)) from exc
