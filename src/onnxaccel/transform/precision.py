"""Prepare a model for a target's precision when the provider has no precision switch of its own.

MIGraphX and TensorRT convert precision themselves (migraphx_fp16_enable, trt_fp16_enable); the CUDA, ROCm
and CPU providers run what the model says, so FP16 there means an FP16 model (rocm_facts.md §3.2).
"""

from __future__ import annotations

import dataclasses
import os

import onnx

from onnxaccel.paths import runtime_models_dir
from onnxaccel.errors import MissingDependencyError, TargetError
from onnxaccel.model import Model
from onnxaccel.target import Target


def prepare_for_target(model: Model, target: Target) -> tuple[Model, Target]:
    """Return (model, target) ready for the engine: a converted model and an fp32-labelled target when the
    provider cannot convert precision itself; the inputs unchanged otherwise."""
    if target.precision_is_native:
        return model, target
    if target.precision == "fp16":
        converted = to_fp16(model)
        return converted, dataclasses.replace(target, precision="fp32")
    raise TargetError(
        f"INT8 on {target.device} needs a quantized model; ONNX Runtime's {target.device} provider does not "
        "quantize by itself.",
        "Quantize the model first (onnxruntime.quantization.quantize_static / quantize_dynamic) and run the "
        "quantized file at fp32.",
    )


def to_fp16(model: Model) -> Model:
    """Convert weights and compute to FP16, keeping FP32 inputs and outputs (keep_io_types=True).

    The converted file is cached beside the other runtime models, keyed by the source file.
    """
    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "cpu", "FP16 conversion") from exc
    path = runtime_models_dir() / f"{model.path.stem}-{model.cache_key()}-fp16.onnx"
    if not path.exists():
        proto = onnx.load(str(model.path))
        fp16 = convert_float_to_float16(proto, keep_io_types=True, disable_shape_infer=False)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        large = fp16.ByteSize() > 1_800_000_000
        onnx.save(fp16, str(tmp), save_as_external_data=large, location=path.name + ".data" if large else None)
        os.replace(tmp, path)
    return dataclasses.replace(
        model, path=path, proto=onnx.load(str(path), load_external_data=False),
        notes=model.notes + (f"converted to FP16 with FP32 inputs/outputs (cached at {path})",),
    )
