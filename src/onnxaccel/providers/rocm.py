"""ONNX Runtime's ROCm execution provider (PyPI onnxruntime-rocm <= 1.22; removed from ONNX Runtime in 1.23)."""

from __future__ import annotations

from onnxaccel.providers.base import Knob, ProviderSpec, Source

ARENA = ("kNextPowerOfTwo", "kSameAsRequested")

#: ROCm EP (onnxruntime-rocm <= 1.22): ROCMExecutionProviderInfo::FromProviderOptions with the same
#: ProviderOptionsParser, so booleans are 0/1 there too (rocm_execution_provider_info.cc L13-30 at v1.22.1;
#: the 1.22.2.post3 binary holds each name as 16-byte fragments, inlined by the compiler).
ROCM_EP_SOURCE = Source("microsoft/onnxruntime", "onnxruntime/core/providers/rocm/rocm_execution_provider_info.cc",
                        "89746dc19a0a1ae59ebf4b16df9acab8f99f3925", "14-30")

# Provider-option keys and value kinds. Source: onnxruntime/core/providers/rocm/rocm_execution_provider_info.cc,
# ORT 1.17-1.22 (v1.22.1 vendored: tests/engines/migraphx/upstream/ort_rocm_info_v1.22.1.txt).
OPTIONS: dict[str, object] = {
    "device_id": "int",
    "has_user_compute_stream": "bool",
    "user_compute_stream": "str",
    "gpu_mem_limit": "int",
    "arena_extend_strategy": ARENA,
    "miopen_conv_exhaustive_search": "bool",
    "miopen_conv_use_max_workspace": "bool",
    "do_copy_in_default_stream": "bool",
    "gpu_external_alloc": "str",
    "gpu_external_free": "str",
    "gpu_external_empty_cache": "str",
    "enable_hip_graph": "bool",
    "tunable_op_enable": "bool",
    "tunable_op_tuning_enable": "bool",
    "tunable_op_max_tuning_duration_ms": "int",
}

# Options that guides recommend but that do not exist. ONNX Runtime accepts any session-config key
# silently, so these would do nothing (no such key in microsoft/onnxruntime's source, nor in the strings of the
# onnxruntime-rocm 1.22.2 binaries: `ort.session.use_rocm_fp16` is not a real key).
FAKE_OPTIONS = {
    "ort.session.use_rocm_fp16": "No such option exists in any ONNX Runtime build. For FP16 on AMD use "
    "--target migraphx/fp16 (migraphx_fp16_enable=1) or convert the model with `onnxaccel optimize --fp16`.",
}

SPEC = ProviderSpec(
    device="rocm",
    provider="ROCMExecutionProvider",
    package=("onnxruntime-rocm", "rocm"),
    options=OPTIONS,
    fake_options=FAKE_OPTIONS,
    # ORT docs: ROCm EP "enable_hip_graph".
    graph_option="enable_hip_graph",
    arena_keys=("arena_extend_strategy", "gpu_mem_limit"),
    tuning=(Knob("graph capture", graph=True),
            Knob("MIOpen algorithm search", ({"miopen_conv_exhaustive_search": "1"},)),
            Knob("GEMM tuning (TunableOp)", ({"tunable_op_enable": "1", "tunable_op_tuning_enable": "1"},))),
    vendor="amd",
    doctor_checks=("gpu", "gfx"),
    removed_in="1.23",
    removed_note="microsoft/onnxruntime#25181",
    replaced_by="migraphx",
    sources=(ROCM_EP_SOURCE,
             "microsoft/onnxruntime onnxruntime/core/providers/rocm/rocm_execution_provider_info.cc (1.17-1.22)"),
)
