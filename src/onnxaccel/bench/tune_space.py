"""What `tune` tries on each device, in the order it tries it.

Sources of the knobs (option names as validated against each provider's option table, onnxaccel.providers):

* CUDA EP (ORT docs "CUDA Execution Provider" and "Tune performance > CUDA"): ``prefer_nhwc`` (NHWC
  convolution kernels, tensor-core friendly), ``enable_cuda_graph`` (replay one captured graph: removes
  kernel-launch cost; needs IO binding and every node on the CUDA EP), ``cudnn_conv_algo_search``
  (EXHAUSTIVE is the default; HEURISTIC skips the benchmark-based search), ``fuse_conv_bias`` (cuDNN frontend
  runtime fusion of Conv + bias + activation), ``tunable_op_enable``/``tunable_op_tuning_enable`` (ORT's TunableOp:
  GEMM kernels chosen by timing at run time, onnxruntime/core/providers/cuda/tunable). What FP16 + IO
  binding + NHWC + graph capture gained over a plain FP16 session is in docs/BENCHMARKS.md.
* ROCm EP (ORT <= 1.22): ``enable_hip_graph``, ``miopen_conv_exhaustive_search``, TunableOp (as on CUDA).
* MIGraphX EP: ``migraphx_exhaustive_tune`` (compile-time kernel tuning; slower compile, faster kernels);
  FP16/INT8 through the provider's own switches (``/fp16``, ``/int8`` targets).
* TensorRT EP: ``trt_cuda_graph_enable``; FP16/INT8 through its own switches.
* CPU EP: ``intra_op_num_threads`` (ORT defaults to one thread per physical core); dynamic INT8.

Precisions the provider cannot run usefully are left out by default (FP16 on the CPU EP runs mostly as
FP32 kernels between inserted casts: ORT's InsertCastTransformer, onnxruntime/core/optimizer/
insert_cast_transformer.cc, rewrites FP16 nodes that have no CPU kernel; INT8 on CUDA/ROCm has no kernels
for quantized convolutions: precision.variant), and can be asked for with ``--precision``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from onnxaccel import providers
from onnxaccel.target import Target

DEFAULT_PRECISIONS = {
    "cpu": ("fp32", "int8"),
    "cuda": ("fp32", "fp16"),
    "rocm": ("fp32", "fp16"),
    # INT8 on MIGraphX is a quantized (QDQ) model, not a switch (engines/ort_ep_options.py); tune a QDQ model
    # with --precision int8.
    "migraphx": ("fp32", "fp16"),
    "tensorrt": ("fp32", "fp16", "int8"),
}


@dataclass(frozen=True)
class Stage:
    """Variants tried on top of the best configuration so far; each variant is a set of options."""

    name: str
    variants: tuple[dict[str, str], ...]
    needs_iobinding: bool = False


def precisions_for(target: Target) -> tuple[str, ...]:
    """Precisions ``tune`` tries by default on the target's device."""
    return DEFAULT_PRECISIONS.get(target.device, ("fp32",))


def stages_for(target: Target, *, threads: tuple[int, ...] | None = None) -> list[Stage]:
    """The tuning stages for the target's device, in the order they are tried."""
    spec = providers.get(target.device)
    if not spec.is_gpu:
        counts = threads or cpu_thread_counts()
        return [Stage("CPU threads (intra_op_num_threads)",
                      tuple({"intra_op_num_threads": str(n)} for n in counts))] if counts else []
    return [_stage(knob, spec) for knob in spec.tuning if not knob.graph or spec.graph_option]


def _stage(knob: providers.Knob, spec: providers.ProviderSpec) -> Stage:
    """A provider's tuning knob as a stage. Graph capture goes through the option the spec names and needs IO
    binding (a captured graph replays fixed device addresses)."""
    if knob.graph:
        option = spec.graph_option
        return Stage(f"graph capture ({option})", ({option: "1"},), needs_iobinding=True)
    return Stage(knob.label, tuple(dict(s) for s in knob.settings))


def cpu_thread_counts() -> tuple[int, ...]:
    """Thread counts worth trying besides ONNX Runtime's default (physical cores): every logical CPU, half,
    and one (the best for tiny models, where threads only add synchronization)."""
    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return tuple(sorted({logical, max(1, logical // 2), 1}, reverse=True))
