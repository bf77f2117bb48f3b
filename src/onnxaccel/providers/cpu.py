"""ONNX Runtime's CPU execution provider: no provider options (ONNX Runtime drops unknown ones silently, so a
target naming one is refused), every precision runs what the model says."""

from __future__ import annotations

from onnxaccel.providers.base import CompileCache, ProviderSpec

SPEC = ProviderSpec(
    device="cpu",
    provider="CPUExecutionProvider",
    package=("onnxruntime", "cpu"),
    is_gpu=False,
    options={},
    device_id_option=None,
    compile_cache=CompileCache("ort-optimized"),
    preference=30,
    doctor_default=True,
    sources=("microsoft/onnxruntime onnxruntime/core/providers/cpu/cpu_execution_provider.h (no provider options)",),
)
