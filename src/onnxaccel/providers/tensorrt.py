"""ONNX Runtime's TensorRT execution provider (PyPI onnxruntime-gpu, with TensorRT installed)."""

from __future__ import annotations

from onnxaccel.providers.base import CompileCache, Knob, ProviderSpec

# Provider-option keys and value kinds. Source: microsoft/onnxruntime
# onnxruntime/core/providers/tensorrt/tensorrt_execution_provider_info.cc (1.20-1.31).
OPTIONS: dict[str, object] = {
    "device_id": "int",
    "trt_max_workspace_size": "int",
    "trt_fp16_enable": "bool",
    "trt_bf16_enable": "bool",
    "trt_int8_enable": "bool",
    "trt_int8_calibration_table_name": "str",
    "trt_int8_use_native_calibration_table": "bool",
    "trt_dla_enable": "bool",
    "trt_dla_core": "int",
    "trt_engine_cache_enable": "bool",
    "trt_engine_cache_path": "str",
    "trt_timing_cache_enable": "bool",
    "trt_timing_cache_path": "str",
    "trt_force_timing_cache": "bool",
    "trt_dump_subgraphs": "bool",
    "trt_detailed_build_log": "bool",
    "trt_builder_optimization_level": "int",
    "trt_auxiliary_streams": "int",
    "trt_min_subgraph_size": "int",
    "trt_max_partition_iterations": "int",
    "trt_layer_norm_fp32_fallback": "bool",
    "trt_cuda_graph_enable": "bool",
    "trt_context_memory_sharing_enable": "bool",
    "trt_build_heuristics_enable": "bool",
    "trt_sparsity_enable": "bool",
    "trt_force_sequential_engine_build": "bool",
    "trt_profile_min_shapes": "str",
    "trt_profile_max_shapes": "str",
    "trt_profile_opt_shapes": "str",
    "trt_tactic_sources": "str",
    "trt_extra_plugin_lib_paths": "str",
    "trt_dump_ep_context_model": "bool",
    "trt_ep_context_file_path": "str",
    "trt_ep_context_embed_mode": "int",
    "trt_engine_hw_compatible": "bool",
    "trt_op_types_to_exclude": "str",
    "trt_weight_stripped_engine_enable": "bool",
    "trt_onnx_model_folder_path": "str",
    "has_user_compute_stream": "bool",
    "user_compute_stream": "str",
}

SPEC = ProviderSpec(
    device="tensorrt",
    provider="TensorrtExecutionProvider",
    package=("onnxruntime-gpu", "cuda"),
    options=OPTIONS,
    # ORT docs: TensorRT EP "trt_cuda_graph_enable".
    graph_option="trt_cuda_graph_enable",
    native_precision={"fp16": {"trt_fp16_enable": "1"}, "int8": {"trt_int8_enable": "1"}},
    # TensorRT builds an engine per optimization profile.
    compiles_per_shape=True,
    tuning=(Knob("graph capture", graph=True),),
    # TensorRT EP: FP32 layers use TF32 unless the builder flag is cleared (no provider option to change it).
    tf32_default=True,
    compile_cache=CompileCache("tensorrt", "engines", "*.engine",
                               {"trt_engine_cache_enable": "1", "trt_engine_cache_path": "{dir}",
                                "trt_timing_cache_enable": "1", "trt_timing_cache_path": "{dir}"}),
    calibration_options=("trt_int8_enable", "trt_int8_calibration_table_name", "trt_int8_use_native_calibration_table"),
    vendor="nvidia",
    doctor_checks=("gpu",),
    sources=("microsoft/onnxruntime onnxruntime/core/providers/tensorrt/tensorrt_execution_provider_info.cc "
             "(1.20-1.31)",),
)
