"""ONNX Runtime's CUDA execution provider (PyPI onnxruntime-gpu)."""

from __future__ import annotations

from onnxaccel.providers.base import CompileCache, Knob, Prewarm, ProviderSpec

ARENA = ("kNextPowerOfTwo", "kSameAsRequested")

# Provider-option keys and value kinds. Source: microsoft/onnxruntime
# onnxruntime/core/providers/cuda/cuda_execution_provider_info.cc (1.20-1.31), equal to the keys
# get_provider_options() reports on onnxruntime-gpu 1.31.1 (benchmarks/history/gpu_foundation.py checks it).
OPTIONS: dict[str, object] = {
    "device_id": "int",
    "gpu_mem_limit": "int",
    "arena_extend_strategy": ARENA,
    "cudnn_conv_algo_search": ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
    "do_copy_in_default_stream": "bool",
    "cudnn_conv_use_max_workspace": "bool",
    "cudnn_conv1d_pad_to_nc1d": "bool",
    "enable_cuda_graph": "bool",
    "enable_cudnn": "bool",
    "external_data_loader_reading_threads": "int",
    "prefer_nhwc": "bool",
    "use_ep_level_unified_stream": "bool",
    "use_tf32": "bool",
    "fuse_conv_bias": "bool",
    "sdpa_kernel": "int",
    "tunable_op_enable": "bool",
    "tunable_op_tuning_enable": "bool",
    "tunable_op_max_tuning_duration_ms": "int",
    "has_user_compute_stream": "bool",
    "user_compute_stream": "str",
    "gpu_external_alloc": "str",
    "gpu_external_free": "str",
    "gpu_external_empty_cache": "str",
}

SPEC = ProviderSpec(
    device="cuda",
    provider="CUDAExecutionProvider",
    package=("onnxruntime-gpu", "cuda"),
    options=OPTIONS,
    # ORT docs: CUDA EP "enable_cuda_graph".
    graph_option="enable_cuda_graph",
    graph_by_default=True,
    # microsoft/onnxruntime#19229 ("[CUDA] support user_compute_stream in python API", in 1.17): the Python API
    # takes the stream's address as a decimal string and sets has_user_compute_stream itself.
    stream_option="user_compute_stream",
    arena_keys=("arena_extend_strategy", "gpu_mem_limit"),
    # The CUDA EP searches cuDNN algorithms per new input shape.
    compiles_per_shape=True,
    tuning=(Knob("layout (prefer_nhwc)", ({"prefer_nhwc": "1"},)),
            Knob("graph capture", graph=True),
            Knob("cuDNN algorithm search", ({"cudnn_conv_algo_search": "HEURISTIC"},)),
            Knob("cuDNN runtime fusion (fuse_conv_bias)", ({"fuse_conv_bias": "1"},)),
            Knob("GEMM tuning (TunableOp)", ({"tunable_op_enable": "1", "tunable_op_tuning_enable": "1"},))),
    # cuda_execution_provider_info.h: use_tf32 defaults to true (FP32 MatMul/Conv on TF32 units from Ampere on).
    tf32_option="use_tf32",
    tf32_default=True,
    compile_cache=CompileCache("ort-optimized"),
    # A first run spends most of its time loading cuDNN/cuBLAS: loaded in the background while a command starts
    # (onnxaccel.prewarm; docs/BENCHMARKS.md "Start-up" has the A/B).
    prewarm=Prewarm(copied=("device_id", "prefer_nhwc", "use_tf32", "enable_cudnn"),
                    options={"cudnn_conv_algo_search": "HEURISTIC"}),  # a tiny conv: no search worth its time
    example="cuda:0/fp16?prefer_nhwc=1",
    preference=20,
    vendor="nvidia",
    doctor_default=True,
    doctor_checks=("gpu",),
    sources=("microsoft/onnxruntime onnxruntime/core/providers/cuda/cuda_execution_provider_info.cc (1.20-1.31)",),
)
