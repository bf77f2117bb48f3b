"""A model at a target's precision: converted here when the provider has no precision switch of its own.

MIGraphX and TensorRT convert precision themselves (migraphx_fp16_enable, trt_fp16_enable, *_int8_enable:
``NATIVE_PRECISION`` in :mod:`onnxaccel.target`); the CUDA, ROCm and CPU providers run what the model says, so
FP16 there means an FP16 model and INT8 means a quantized model (ONNX Runtime's guide "Create Float16 and Mixed
Precision Models", https://onnxruntime.ai/docs/performance/model-optimizations/float16.html: "Convert a model to
float16" with convert_float_to_float16). Converted models are cached beside the other runtime models, keyed by
the source file, so `run`/`bench` convert once, and a conversion reads the source model at most once (not at all
when its weights are already in memory).

:func:`convert_for_target` returns a :class:`PrecisionVariant`: the model to run and the target as asked, so the
precision stays the caller's value from conversion to runner (the engine is told only that the graph already
has it). :func:`prepare_for_target` is the same as the (model, engine target) pair the engines take.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from onnxaccel import providers, startup
from onnxaccel.errors import TargetError
from onnxaccel.model import Model
from onnxaccel.paths import runtime_models_dir
from onnxaccel.precision.checkpoint import EXTERNAL_DATA_THRESHOLD, save_model
from onnxaccel.precision.fp16 import convert_fp16, fp16_kept, keep_fp32_nodes
from onnxaccel.precision.int8 import quantize_dynamic
from onnxaccel.target import Target

#: ONNX Runtime's name for the CPU provider (from the registry: only providers/ and engines/ spell it).
_CPU = providers.get("cpu").provider


@dataclass(frozen=True)
class PrecisionVariant:
    """The model an engine runs for ``target``, and whether onnxaccel converted it to ``target.precision``.

    ``target`` is the caller's, precision included (``cuda/fp16``); it is what a runner reports. A converted
    model already computes in that precision, so the engine is given :attr:`engine_target`, which asks it
    for nothing more (the ONNX Runtime engine refuses a precision its provider cannot switch on itself).
    """

    model: Model
    target: Target
    converted: bool = False

    @property
    def precision(self) -> str:
        """The precision the model runs in: the target's (converted here, or by the provider)."""
        return self.target.precision

    @property
    def engine_target(self) -> Target:
        """The target for ``engines.compile_model``: as asked, or, for a model converted here, the same target
        running the graph as it is (precision ``fp32`` = no conversion by the provider)."""
        return dataclasses.replace(self.target, precision="fp32") if self.converted else self.target


def convert_for_target(model: Model, target: Target) -> PrecisionVariant:
    """The model ready for ``target``'s precision: converted (FP16, or dynamic INT8 on the CPU) when the
    provider cannot convert itself, else unchanged. INT8 on a GPU provider without INT8 kernels is refused."""
    if target.precision_is_native:
        return PrecisionVariant(model, target)
    if target.precision == "fp16":
        # Probe the provider the model will run on for missing FP16 kernels (when it is installed here).
        return PrecisionVariant(to_fp16(model, provider=target.provider), target, converted=True)
    if target.device == "cpu":
        return PrecisionVariant(to_int8_dynamic(model), target, converted=True)
    raise TargetError(
        f"INT8 on {target.device} needs a provider with INT8 kernels; ONNX Runtime's {target.provider} runs "
        "quantized models only partly or not at all (Hugging Face Optimum's GPU guide: \"it is not possible to "
        "run quantized models on\" the CUDA provider; ConvInteger has no CUDA kernel).",
        "Use --target tensorrt/int8 (NVIDIA) with a calibration table from `onnxaccel optimize --int8 static "
        "--native --calibration DATA --target tensorrt`; on AMD, quantize with `onnxaccel optimize --int8 static "
        "--calibration DATA` and run the QDQ model with --target migraphx/int8; on the CPU, --target cpu/int8 works.",
    )


def prepare_for_target(model: Model, target: Target) -> tuple[Model, Target]:
    """``(model, engine target)`` for ``engines.compile_model``: :func:`convert_for_target`'s variant as the
    pair the engines take (the engine target says fp32 for a model converted here)."""
    variant = convert_for_target(model, target)
    return variant.model, variant.engine_target


def to_fp16(model: Model, provider: str | None = _CPU) -> Model:
    """Convert weights and compute to FP16, keeping FP32 inputs and outputs (keep_io_types=True).

    Nodes listed in the model's ``onnxaccel.fp16.keep_fp32_nodes`` metadata stay FP32 (set by
    ``onnxaccel optimize --fp16 --amp``), and so do ops the schema or ``provider`` (when available here)
    cannot run in FP16; the note lists them.
    """
    def convert(proto: onnx.ModelProto) -> onnx.ModelProto:
        return convert_fp16(proto, keep_io_types=True, provider=provider)

    kept = keep_fp32_nodes(model.proto)
    ins = "/".join(sorted({str(np.dtype(spec.dtype)) for spec in model.inputs})) or "none"
    outs = "/".join(sorted({str(np.dtype(spec.dtype)) for spec in model.outputs})) or "none"
    # What the converted model takes and gives: its I/O types as they were (uint8 pixels stay uint8).
    note = f"converted to FP16 with {ins} inputs and {outs} outputs kept"
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
    note = ("quantized to INT8 dynamically (no calibration data; for CNNs prefer `onnxaccel optimize --int8 "
            "static --calibration DATA`)")
    return _cached_variant(model, "int8-dynamic-v2", lambda proto: quantize_dynamic(proto, source=str(model.source)),
                           note)


def _cached_variant(model: Model, tag: str, convert: Callable[[onnx.ModelProto], onnx.ModelProto],
                    note: str) -> Model:
    """``model`` converted by ``convert``, from the cache when an earlier run wrote it, else converted, checked
    and written there. The source is read from its file only when its weights are not in memory already, and a
    variant written now is not read back (unless too large to keep its weights in a ModelProto)."""
    # The tag carries a version: variants written before the checkpoint existed may be invalid (unsorted
    # FP16 graphs) or no-ops (INT8 of a CNN), and must not be reused.
    path = runtime_models_dir() / f"{model.path.stem}-{model.cache_key()}-{tag}.onnx"
    proto = None
    with startup.stage("variant", detail=f"{tag}: {'cached copy read' if path.exists() else 'converted'}"):
        if not path.exists():
            source = model.proto if _weights_in_memory(model.proto) else onnx.load(str(model.path))
            written = convert(source)
            save_model(written, path, converter=f"{tag} conversion for --precision")
            proto = written if _weights_in_memory(written) else None
        if proto is None:
            proto = onnx.load(str(path), load_external_data=False)
    return dataclasses.replace(model, path=Path(path), proto=proto, notes=model.notes + (f"{note} (cached at {path})",))


def _weights_in_memory(proto: onnx.ModelProto) -> bool:
    """True when ``proto`` holds all its weights (no external data) and is small enough to be written inline,
    so it equals what loading its file gives (:data:`EXTERNAL_DATA_THRESHOLD`)."""
    tensors = onnx.external_data_helper._get_all_tensors(proto)
    return (not any(onnx.external_data_helper.uses_external_data(t) for t in tensors)
            and proto.ByteSize() <= EXTERNAL_DATA_THRESHOLD)
