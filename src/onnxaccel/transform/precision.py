"""Prepare a model for a target's precision when the provider has no precision switch of its own.

MIGraphX and TensorRT convert precision themselves (migraphx_fp16_enable, trt_fp16_enable, *_int8_enable); the
CUDA, ROCm and CPU providers run what the model says, so FP16 there means an FP16 model (rocm_facts.md §3.2)
and INT8 means a quantized model. Converted models are cached beside the other runtime models, keyed by the
source file, so `run`/`bench` convert once.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx

from onnxaccel.errors import TargetError
from onnxaccel.model import Model
from onnxaccel.paths import runtime_models_dir
from onnxaccel.target import Target
from onnxaccel.transform.files import save_model
from onnxaccel.transform.fp16 import convert_fp16, fp16_kept, keep_fp32_nodes


def prepare_for_target(model: Model, target: Target) -> tuple[Model, Target]:
    """Return (model, target) ready for the engine: a converted model and an fp32-labelled target when the
    provider cannot convert precision itself; the inputs unchanged otherwise."""
    if target.precision_is_native:
        return model, target
    if target.precision == "fp16":
        # Probe the provider the model will run on for missing FP16 kernels (when it is installed here).
        return to_fp16(model, provider=target.provider), dataclasses.replace(target, precision="fp32")
    if target.device == "cpu":
        return to_int8_dynamic(model), dataclasses.replace(target, precision="fp32")
    raise TargetError(
        f"INT8 on {target.device} needs a provider with INT8 kernels; ONNX Runtime's {target.provider} runs "
        "quantized models only partly or not at all (\"it is not possible to run quantized models on "
        "CUDAExecutionProvider\", Hugging Face Optimum GPU guide; ConvInteger has no CUDA kernel).",
        "Use --target tensorrt/int8 (NVIDIA) with a calibration table from `onnxaccel optimize --int8 static "
        "--native --calibration DATA --target tensorrt`; on AMD, quantize with `onnxaccel optimize --int8 static "
        "--calibration DATA` and run the QDQ model with --target migraphx/int8; on the CPU, --target cpu/int8 works.",
    )


def to_fp16(model: Model, provider: str | None = "CPUExecutionProvider") -> Model:
    """Convert weights and compute to FP16, keeping FP32 inputs and outputs (keep_io_types=True).

    Nodes listed in the model's ``onnxaccel.fp16.keep_fp32_nodes`` metadata stay FP32 (set by
    ``onnxaccel optimize --fp16 --amp``), and so do ops the schema or ``provider`` (when available here)
    cannot run in FP16; the note lists them.
    """
    def convert(proto: onnx.ModelProto) -> onnx.ModelProto:
        return convert_fp16(proto, keep_io_types=True, provider=provider)

    kept = keep_fp32_nodes(model.proto)
    note = "converted to FP16 with FP32 inputs/outputs"
    if kept:
        note += f", {len(kept)} node(s) kept in FP32 as the model's metadata asks"
    tag = f"fp16-v2-{(provider or 'any').replace('ExecutionProvider', '').lower()}"
    converted = _cached_variant(model, tag, convert, note)
    auto = [k for k in fp16_kept(converted.proto) if k.get("node") not in set(kept)]
    if auto:
        ops = sorted({k.get("op", "?") for k in auto})
        converted = dataclasses.replace(converted, notes=converted.notes + (
            f"{len(auto)} node(s) kept in FP32 automatically ({', '.join(ops)}): {auto[0].get('reason')}",))
    return converted


def to_int8_dynamic(model: Model) -> Model:
    """Dynamic INT8 quantization (weights INT8, activations quantized at run time from their own range).

    Needs no calibration data, so it is sound for `run`/`bench --precision int8` on the CPU; for CNNs static
    quantization with real calibration data (`onnxaccel optimize --int8 static`) is usually faster and more
    accurate (ONNX Runtime quantization guide: dynamic for transformers/RNNs, static for CNNs). A model with
    nothing dynamic INT8 quantizes (a CNN: Conv is left to static mode) raises instead of running FP32 under
    an INT8 label.
    """
    from onnxaccel.transform.int8 import quantize_dynamic_proto

    note = ("quantized to INT8 dynamically (no calibration data; for CNNs prefer `onnxaccel optimize --int8 "
            "static --calibration DATA`)")
    return _cached_variant(model, "int8-dynamic-v2",
                           lambda proto: quantize_dynamic_proto(proto, source=str(model.source)), note)


def _cached_variant(model: Model, tag: str, convert, note: str) -> Model:
    # The tag carries a version: variants written before the checkpoint existed may be invalid (unsorted
    # FP16 graphs) or no-ops (INT8 of a CNN), and must not be reused.
    path = runtime_models_dir() / f"{model.path.stem}-{model.cache_key()}-{tag}.onnx"
    if not path.exists():
        proto = onnx.load(str(model.path))
        save_model(convert(proto), path, converter=f"{tag} conversion for --precision")
    return dataclasses.replace(
        model, path=Path(path), proto=onnx.load(str(path), load_external_data=False),
        notes=model.notes + (f"{note} (cached at {path})",),
    )
