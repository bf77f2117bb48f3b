"""Target: where and how a model runs, parsed from one short string and printable back to it.

Grammar: ``DEVICE[:ID][/PRECISION][@ENGINE][?KEY=VALUE&KEY=VALUE...]``

    cpu                       ONNX Runtime, CPUExecutionProvider, fp32
    cuda:1/fp16               CUDAExecutionProvider on GPU 1, an FP16 model
    migraphx:0/int8           MIGraphXExecutionProvider running a quantized (QDQ) model in INT8
    migraphx@migraphx         the native MIGraphX engine instead of ONNX Runtime
    cuda?prefer_nhwc=1&enable_cuda_graph=1

The same string appears on the command line, in a ``tune`` result, in benchmark reports and in serving
configs. Option keys are checked against what the provider accepts *before* a session is built, because
ONNX Runtime silently ignores unknown CPU options and unknown session-config keys.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import parse_qsl, quote

from onnxaccel.errors import ProviderOptionError, TargetError

DEVICES = ("cpu", "cuda", "tensorrt", "migraphx", "rocm")
#: The provider option that turns on graph capture, by device (names as in PROVIDER_OPTIONS; ORT docs: CUDA EP
#: "enable_cuda_graph", TensorRT EP "trt_cuda_graph_enable", ROCm EP "enable_hip_graph"). The MIGraphX EP has
#: no such option: MIGraphX compiles the whole graph into one program itself.
GRAPH_OPTION = {"cuda": "enable_cuda_graph", "tensorrt": "trt_cuda_graph_enable", "rocm": "enable_hip_graph"}
PRECISIONS = ("fp32", "fp16", "int8")
ENGINES = ("ort", "migraphx")

PROVIDER = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider",
    "rocm": "ROCMExecutionProvider",
}

#: Which distribution brings each provider (the onnxaccel extra in brackets).
PROVIDER_PACKAGE = {
    "cpu": ("onnxruntime", "cpu"),
    "cuda": ("onnxruntime-gpu", "cuda"),
    "tensorrt": ("onnxruntime-gpu", "cuda"),
    "migraphx": ("onnxruntime-migraphx", "migraphx"),
    "rocm": ("onnxruntime-rocm", "rocm"),
}

# Session-level knobs any target may carry; they go to SessionOptions, not to the provider.
SESSION_OPTIONS = {
    "intra_op_num_threads": "int",
    "inter_op_num_threads": "int",
    "graph_optimization_level": ("disable", "basic", "extended", "layout", "all"),
    "execution_mode": ("sequential", "parallel"),
    "enable_mem_pattern": "bool",
    "enable_cpu_mem_arena": "bool",
}

_ARENA = ("kNextPowerOfTwo", "kSameAsRequested")

# Provider-option keys and value kinds. Sources:
#   CUDA: microsoft/onnxruntime onnxruntime/core/providers/cuda/cuda_execution_provider_info.cc (1.20-1.31),
#         equal to the keys get_provider_options() reports on onnxruntime-gpu 1.31.1 (H200, 2026-12-02;
#         benchmarks/gpu_foundation.py checks it).
#   MIGraphX: keys in the option-name table of libonnxruntime_providers_migraphx.so from
#         onnxruntime-migraphx 1.23.2 and 1.27.1; newer keys in _MIGRAPHX_NEWER. This is the target grammar
#         (a target string is portable); which keys an installed build takes, how it spells booleans and what
#         it reads only from ORT_MIGRAPHX_* variables is per flavour in engines/ort_flavour.py, applied when a
#         session is built (engines/ort_ep_options.py).
#   ROCm: onnxruntime/core/providers/rocm/rocm_execution_provider_info.cc, ORT 1.17-1.22 (v1.22.1 vendored:
#         tests/engines/migraphx/upstream/ort_rocm_info_v1.22.1.txt).
#   TensorRT: onnxruntime/core/providers/tensorrt/tensorrt_execution_provider_info.cc (1.20-1.31).
PROVIDER_OPTIONS: dict[str, dict[str, object]] = {
    "cpu": {},
    "cuda": {
        "device_id": "int",
        "gpu_mem_limit": "int",
        "arena_extend_strategy": _ARENA,
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
    },
    "migraphx": {
        "device_id": "int",
        "migraphx_fp16_enable": "bool",
        "migraphx_bf16_enable": "bool",
        "migraphx_fp8_enable": "bool",
        "migraphx_int8_enable": "bool",
        "migraphx_int8_calibration_table_name": "str",
        "migraphx_int8_use_native_calibration_table": "bool",
        "migraphx_exhaustive_tune": "bool",
        "migraphx_mem_limit": "int",
        "migraphx_arena_extend_strategy": _ARENA,
        "migraphx_external_alloc": "str",
        "migraphx_external_free": "str",
        "migraphx_external_empty_cache": "str",
        "migraphx_model_cache_dir": "str",
    },
    "rocm": {
        "device_id": "int",
        "has_user_compute_stream": "bool",
        "user_compute_stream": "str",
        "gpu_mem_limit": "int",
        "arena_extend_strategy": _ARENA,
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
    },
    "tensorrt": {
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
    },
}

# Keys in MIGraphX EP source after the 1.27.1 wheel (microsoft/onnxruntime @03c1250,
# migraphx_execution_provider_info.h L37-38). A target may name them; a session passes them only when the
# installed build's provider library declares them, else it refuses with the reason (engines/ort_ep_options.py).
_MIGRAPHX_NEWER = {"migraphx_max_dynamic_batch": "int", "migraphx_max_compiled_models": "int"}

# Options that guides recommend but that do not exist. ONNX Runtime accepts any session-config key
# silently, so these would do nothing (no such key in microsoft/onnxruntime's source, nor in the strings of the
# onnxruntime-rocm 1.22.2 binaries: `ort.session.use_rocm_fp16` is not a real key).
KNOWN_FAKE_OPTIONS = {
    "ort.session.use_rocm_fp16": "No such option exists in any ONNX Runtime build. For FP16 on AMD use "
    "--target migraphx/fp16 (migraphx_fp16_enable=1) or convert the model with `onnxaccel optimize --fp16`.",
}

# Precision switches that the provider itself implements. Other providers need a converted model.
# MIGraphX INT8 is the exception in practice: the EP quantizes only with a calibration table it never fills
# (engines/ort_ep_options.py), so migraphx/int8 runs a model whose graph is already quantized (QDQ) and the
# switch is not passed; a float model is refused with the fix.
NATIVE_PRECISION = {
    ("migraphx", "fp16"): {"migraphx_fp16_enable": "1"},
    ("migraphx", "int8"): {"migraphx_int8_enable": "1"},
    ("tensorrt", "fp16"): {"trt_fp16_enable": "1"},
    ("tensorrt", "int8"): {"trt_int8_enable": "1"},
}


@dataclass(frozen=True)
class Target:
    """Engine, device, precision and options. ``str(target)`` gives back the string it was parsed from."""

    device: str = "cpu"
    device_id: int | None = None
    precision: str = "fp32"
    engine: str = "ort"
    options: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def provider(self) -> str:
        """The ONNX Runtime execution provider name for the device."""
        return PROVIDER[self.device]

    @property
    def is_gpu(self) -> bool:
        """True for every device but the CPU."""
        return self.device != "cpu"

    @property
    def option_dict(self) -> dict[str, str]:
        """The options as a dict."""
        return dict(self.options)

    def provider_options(self) -> dict[str, str]:
        """Options for the execution provider: the user's, plus device id and native precision switches."""
        opts = {k: v for k, v in self.options if k not in SESSION_OPTIONS}
        if self.device_id is not None and self.device != "cpu":
            opts.setdefault("device_id", str(self.device_id))
        for key, value in NATIVE_PRECISION.get((self.device, self.precision), {}).items():
            opts.setdefault(key, value)
        return opts

    def session_options(self) -> dict[str, str]:
        """The options meant for the session rather than the execution provider."""
        return {k: v for k, v in self.options if k in SESSION_OPTIONS}

    @property
    def precision_is_native(self) -> bool:
        """True when the provider converts precision itself; False when the model must be converted."""
        return self.precision == "fp32" or (self.device, self.precision) in NATIVE_PRECISION

    def with_options(self, extra: Mapping[str, str]) -> Target:
        """A copy with ``extra`` options added or replacing existing ones (validated)."""
        merged = dict(self.options)
        merged.update({k: str(v) for k, v in extra.items()})
        return validated(replace(self, options=tuple(sorted(merged.items()))))

    def without_options(self, *keys: str) -> Target:
        """A copy without the named options."""
        return replace(self, options=tuple(kv for kv in self.options if kv[0] not in keys))

    @property
    def graph_capture(self) -> bool:
        """Whether the target's options turn on graph capture (GRAPH_OPTION)."""
        key = GRAPH_OPTION.get(self.device)
        return key is not None and self.option_dict.get(key, "0").lower() in ("1", "true")

    def with_precision(self, precision: str) -> Target:
        """A copy at ``precision`` (validated against the device)."""
        return validated(replace(self, precision=precision))

    def __str__(self) -> str:
        text = self.device
        if self.device_id is not None:
            text += f":{self.device_id}"
        if self.precision != "fp32":
            text += f"/{self.precision}"
        if self.engine != "ort":
            text += f"@{self.engine}"
        if self.options:
            text += "?" + "&".join(f"{k}={quote(v, safe='/:.,-_')}" for k, v in self.options)
        return text

    def to_dict(self) -> dict:
        """JSON-ready form of the target: its string and parsed parts."""
        return {
            "target": str(self),
            "engine": self.engine,
            "device": self.device,
            "device_id": self.device_id,
            "precision": self.precision,
            "provider": self.provider if self.engine == "ort" else None,
            "options": dict(self.options),
        }


def gpu_session_threads(target: Target) -> dict[str, str]:
    """Extra options for a GPU ONNX Runtime session's CPU thread pool: one thread, unless the target sets
    ``intra_op_num_threads`` ({} then, and for CPU targets and MIGraphX). The pool only runs the few CPU-placed
    (shape) nodes, but by default has one spinning thread per core, which competes with everything else the
    process and machine do for a GPU: serve's event loops, batch's readers, decoders and writer."""
    if not target.is_gpu or target.engine != "ort" or "intra_op_num_threads" in target.option_dict:
        return {}
    return {"intra_op_num_threads": "1"}


def parse_target(
    text: str,
    *,
    precision: str | None = None,
    options: Iterable[str] | Mapping[str, str] = (),
    engine: str | None = None,
) -> Target:
    """Parse a target string; ``precision``, ``options`` (``KEY=VALUE`` items) and ``engine`` override it."""
    if isinstance(text, Target):
        base = text
    else:
        base = _parse_string(str(text).strip())
    extra = dict(options) if isinstance(options, Mapping) else _parse_option_items(options)
    merged = dict(base.options)
    merged.update(extra)
    target = replace(
        base,
        precision=(precision or base.precision).lower(),
        engine=(engine or base.engine).lower(),
        options=tuple(sorted(merged.items())),
    )
    return validated(target)


def validated(target: Target) -> Target:
    """Check device, precision, engine and every option key and value; normalize booleans to 0/1."""
    if target.precision not in PRECISIONS:
        raise TargetError(
            f"Unknown precision '{target.precision}'.", f"Use one of: {', '.join(PRECISIONS)}."
        )
    if target.engine not in ENGINES:
        raise TargetError(f"Unknown engine '{target.engine}'.", f"Use one of: {', '.join(ENGINES)}.")
    if target.engine == "migraphx" and target.device != "migraphx":
        raise TargetError(
            f"The native MIGraphX engine runs only on AMD GPUs; the target names '{target.device}'.",
            "Use migraphx@migraphx (or --engine migraphx --target migraphx), or drop @migraphx.",
        )
    if target.engine != "ort":
        # The native engine checks its own options (engines/migraphx_setup.py NATIVE_OPTIONS: arguments of
        # parse_onnx / program.compile and the .mxr cache), which differ from the EP's provider options.
        return target
    known = dict(PROVIDER_OPTIONS[target.device])
    if target.device == "migraphx":
        known.update(_MIGRAPHX_NEWER)
    normalized = []
    for key, value in target.options:
        if key in KNOWN_FAKE_OPTIONS:
            raise ProviderOptionError(f"'{key}' is not an ONNX Runtime option.", KNOWN_FAKE_OPTIONS[key])
        kind = SESSION_OPTIONS.get(key) or known.get(key)
        if kind is None:
            raise ProviderOptionError(_unknown_option_message(target.device, key), _valid_keys_hint(target.device, key))
        normalized.append((key, _check_value(target.device, key, value, kind)))
    return replace(target, options=tuple(sorted(normalized)))


def _parse_string(text: str) -> Target:
    if not text:
        raise TargetError("The target is empty.", f"Use one of: {', '.join(DEVICES)} (e.g. cuda:0/fp16).")
    head, _, query = text.partition("?")
    head, _, engine = head.partition("@")
    head, _, precision = head.partition("/")
    device, _, dev_id = head.partition(":")
    device = device.lower()
    if device not in DEVICES:
        close = difflib.get_close_matches(device, DEVICES, n=1)
        raise TargetError(
            f"Unknown target device '{device}' in '{text}'.",
            (f"Did you mean '{close[0]}'? " if close else "")
            + f"Targets: {', '.join(DEVICES)}, with an optional :ID, /PRECISION and ?KEY=VALUE options.",
        )
    device_id = None
    if dev_id:
        if not dev_id.isdigit():
            raise TargetError(f"The device id in '{text}' must be a number, got '{dev_id}'.", f"e.g. {device}:0")
        if device == "cpu":
            raise TargetError("The cpu target takes no device id.", "Use --target cpu.")
        device_id = int(dev_id)
    options = tuple(sorted(parse_qsl(query, keep_blank_values=True))) if query else ()
    return Target(device=device, device_id=device_id, precision=(precision or "fp32").lower(),
                  engine=(engine or "ort").lower(), options=options)


def _parse_option_items(items: Iterable[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ProviderOptionError(
                f"Cannot read the option '{item}'.", "Write --ep-option KEY=VALUE, e.g. --ep-option prefer_nhwc=1."
            )
        out[key.strip()] = value.strip()
    return out


def _check_value(device: str, key: str, value: str, kind: object) -> str:
    bad = None
    if kind == "bool":
        low = value.lower()
        if low in ("1", "true", "on", "yes"):
            return "1"
        if low in ("0", "false", "off", "no"):
            return "0"
        bad = "0 or 1"
    elif kind == "int":
        if value.strip().lstrip("-").isdigit():
            return value.strip()
        bad = "an integer"
    elif isinstance(kind, tuple):
        match = {v.lower(): v for v in kind}.get(value.lower())
        if match:
            return match
        bad = "one of " + ", ".join(kind)
    else:
        return value
    raise ProviderOptionError(f"Option {key}={value!r} for {device}: the value must be {bad}.", f"e.g. {key}={_example_value(kind)}")


def _example_value(kind: object) -> str:
    if kind == "bool":
        return "1"
    if kind == "int":
        return "0"
    return kind[0] if isinstance(kind, tuple) else "VALUE"


def _unknown_option_message(device: str, key: str) -> str:
    others = [d for d, keys in PROVIDER_OPTIONS.items() if key in keys and d != device]
    where = f" (it is a {', '.join(others)} option)" if others else ""
    return f"'{key}' is not an option of {PROVIDER[device]}{where}."


def _valid_keys_hint(device: str, key: str) -> str:
    keys = sorted(PROVIDER_OPTIONS[device]) + sorted(SESSION_OPTIONS)
    close = difflib.get_close_matches(key, keys, n=1)
    lead = f"Did you mean '{close[0]}'? " if close else ""
    if device == "cpu":
        return lead + "The CPU provider takes no provider options (ONNX Runtime would drop them silently); " \
            f"session options: {', '.join(sorted(SESSION_OPTIONS))}."
    return lead + f"Valid options for {device}: {', '.join(keys)}."
