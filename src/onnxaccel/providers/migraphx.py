"""ONNX Runtime's MIGraphX execution provider (AMD GPUs), and how each ONNX Runtime build reads its options.

The same ``migraphx_fp16_enable=1`` works on one AMD ONNX Runtime build and breaks session creation on
another, because three different parsers have read MIGraphX options (each held below as one table, with the
upstream code it was read from):

* **ONNX Runtime >= 1.23** (PyPI ``onnxruntime-migraphx`` 1.23.x-1.27.x, microsoft/onnxruntime main): the
  Python binding hands the options to the provider library, whose ``ProviderOptionsParser`` reads booleans as
  0/1/true/false and rejects other keys with ``Unknown provider option``.
* **AMD's per-ROCm-release builds** (ROCm/onnxruntime branches ``rel-1.22.1``, ``rocm7.0_internal_testing``,
  ``rocm6.4_internal_testing``): the Python binding parses the options itself, accepts only
  "True"/"true"/"False"/"false" and throws ``Invalid MIGraphX EP option`` for the keys it does not list.
* **Microsoft's v1.20.0-v1.22.1 tags**: the same hand-written binding parser with other keys, and a provider
  whose constructor takes FP16, INT8 and exhaustive tuning only from ``ORT_MIGRAPHX_*`` environment variables.

Which flavour is installed is recognised in engines/ort_flavour.py. NOT EXECUTED ON AMD HARDWARE: the tables
come from source and from the bytes of the PyPI wheels onnxruntime-migraphx 1.23.2 and 1.27.1.
"""

from __future__ import annotations

from onnxaccel.providers.base import CompileCache, Flavour, Knob, ProviderSpec, Source

ARENA = ("kNextPowerOfTwo", "kSameAsRequested")

# Provider-option keys and value kinds: the keys in the option-name table of libonnxruntime_providers_migraphx.so
# from onnxruntime-migraphx 1.23.2 and 1.27.1; newer keys in NEWER_OPTIONS. This is the target grammar
# (a target string is portable); which keys an installed build takes, how it spells booleans and what
# it reads only from ORT_MIGRAPHX_* variables is per flavour (FLAVOURS below), applied when a
# session is built (engines/ort_ep_options.py).
OPTIONS: dict[str, object] = {
    "device_id": "int",
    "migraphx_fp16_enable": "bool",
    "migraphx_bf16_enable": "bool",
    "migraphx_fp8_enable": "bool",
    "migraphx_int8_enable": "bool",
    "migraphx_int8_calibration_table_name": "str",
    "migraphx_int8_use_native_calibration_table": "bool",
    "migraphx_exhaustive_tune": "bool",
    "migraphx_mem_limit": "int",
    "migraphx_arena_extend_strategy": ARENA,
    "migraphx_external_alloc": "str",
    "migraphx_external_free": "str",
    "migraphx_external_empty_cache": "str",
    "migraphx_model_cache_dir": "str",
}

# Keys in MIGraphX EP source after the 1.27.1 wheel (microsoft/onnxruntime @03c1250,
# migraphx_execution_provider_info.h L37-38). A target may name them; a session passes them only when the
# installed build's provider library declares them, else it refuses with the reason (engines/ort_ep_options.py).
NEWER_OPTIONS = {"migraphx_max_dynamic_batch": "int", "migraphx_max_compiled_models": "int"}

_MS = "microsoft/onnxruntime"
_AMD = "ROCm/onnxruntime"
_PYBIND = "onnxruntime/python/onnxruntime_pybind_state.cc"
_EP_CC = "onnxruntime/core/providers/migraphx/migraphx_execution_provider.cc"

#: ORT >= 1.23: the provider's own parser. Keys: the option-name strings of libonnxruntime_providers_migraphx.so
#: in the PyPI wheels onnxruntime-migraphx 1.23.2 and 1.27.1 (tests/engines/migraphx/upstream/ort_wheel_*.txt),
#: equal to migraphx_execution_provider_info.h at 03c1250 less the two keys added after 1.27.1. Booleans:
#: TryParseStringWithClassicLocale(bool) takes "0"/"1"/"False"/"false"/"True"/"true" (parse_string.h L80-92).
#: INT8 table: at 03c1250 the constructor still reads the table into a local `dynamic_range_map` inside
#: `if (int8_calibration_cache_available_)` and never fills the member it quantizes with.
ORT_1_23 = Flavour(
    name="ort-1.23+", title="ONNX Runtime >= 1.23 (PyPI onnxruntime-migraphx, microsoft/onnxruntime main)",
    keys=frozenset({
        "device_id", "migraphx_fp16_enable", "migraphx_bf16_enable", "migraphx_fp8_enable", "migraphx_int8_enable",
        "migraphx_int8_calibration_table_name", "migraphx_int8_use_native_calibration_table",
        "migraphx_exhaustive_tune", "migraphx_mem_limit", "migraphx_arena_extend_strategy",
        "migraphx_external_alloc", "migraphx_external_free", "migraphx_external_empty_cache",
        "migraphx_model_cache_dir"}),
    true="1", false="0", env_only={}, unknown_key_error='Unknown provider option: "<key>"',
    uses_calibration_table=False,
    sources=(Source("PyPI onnxruntime-migraphx 1.23.2 / 1.27.1 wheels",
                    "onnxruntime/capi/libonnxruntime_providers_migraphx.so", "sha256 6e0914c8b490 / 4a178713a67d"),
             Source(_MS, "onnxruntime/core/providers/migraphx/migraphx_execution_provider_info.h",
                    "03c125006fc8276159753be0cc577fc0e6b4551d", "22-39"),
             Source(_MS, "include/onnxruntime/core/common/parse_string.h",
                    "89746dc19a0a1ae59ebf4b16df9acab8f99f3925", "80-92")),
    checked="binary here (1.23.2, 1.27.1 wheels) and source")

#: AMD's per-release branches: the Python binding's MIGraphX branch compares option.first with
#: migraphx_provider_option::k* (migraphx_execution_provider_info.h L17-32 there) and option.second with
#: "True"/"true"/"False"/"false" (onnxruntime_pybind_state.cc L909-1012). The provider constructor takes every
#: setting from the session info, then lets ORT_MIGRAPHX_* override it (get_flags_from_env). The table is read
#: into a local (migraphx_execution_provider.cc L162-167); quantize_int8 runs only for
#: `(int8_enable xor fp8_enable) && int8_calibration_cache_available` (L1291) on dynamic_range_map_ (L1445).
AMD_REL_1_22 = Flavour(
    name="amd-rel-1.22", title="AMD ROCm/onnxruntime per-release build (rel-1.22.1, rocm7.0, rocm6.4 branches)",
    keys=frozenset({
        "device_id", "migraphx_fp16_enable", "migraphx_bf16_enable", "migraphx_fp8_enable", "migraphx_int8_enable",
        "migraphx_int8_calibration_table_name", "migraphx_int8_use_native_calibration_table",
        "migraphx_model_cache_dir", "migraphx_exhaustive_tune"}),
    true="True", false="False", env_only={}, unknown_key_error="Invalid MIGraphX EP option: <key>",
    uses_calibration_table=False,
    sources=(Source(_AMD, _PYBIND, "84181618603f4691b7118c8b8a5f5f03c920220b", "909-1012"),
             Source(_AMD, _PYBIND, "3998378a4e429832b2a0a863bdf36bcafa1bcd4d", "909-1012"),
             Source(_AMD, "onnxruntime/core/providers/migraphx/migraphx_execution_provider_info.h",
                    "84181618603f4691b7118c8b8a5f5f03c920220b", "17-32"),
             Source(_AMD, _EP_CC, "84181618603f4691b7118c8b8a5f5f03c920220b", "161-167, 1281-1299, 1444-1445")),
    checked="source only")

#: Microsoft's v1.20.0-v1.22.1 tags (the key set is the same at every tag in between): the binding parses
#: "True"/"true"/"False"/"false" and these keys (L909-1022 at v1.22.1), but the provider constructor sets
#: fp16_enable_, int8_enable_ and exhaustive_tune_ only from ORT_MIGRAPHX_FP16_ENABLE, ORT_MIGRAPHX_INT8_ENABLE
#: and ORT_MIGRAPHX_EXHAUSTIVE_TUNE (std::stoi, migraphx_execution_provider.cc L107-124, L187-191): the
#: options are parsed and ignored. The INT8 table goes to a local map (L150-157) and quantize_int8 iterates
#: the member dynamic_range_map_ (L1166-1178), which nothing assigns.
MICROSOFT_1_20 = Flavour(
    name="microsoft-1.20-1.22", title="ONNX Runtime v1.20.0-v1.22.1 built from Microsoft's tags",
    keys=frozenset({
        "device_id", "migraphx_fp16_enable", "migraphx_int8_enable", "migraphx_int8_calibration_table_name",
        "migraphx_use_native_calibration_table", "migraphx_save_compiled_model", "migraphx_save_model_path",
        "migraphx_load_compiled_model", "migraphx_load_model_path", "migraphx_exhaustive_tune"}),
    true="True", false="False",
    env_only={"migraphx_fp16_enable": "ORT_MIGRAPHX_FP16_ENABLE", "migraphx_int8_enable": "ORT_MIGRAPHX_INT8_ENABLE",
              "migraphx_exhaustive_tune": "ORT_MIGRAPHX_EXHAUSTIVE_TUNE",
              "migraphx_int8_calibration_table_name": "ORT_MIGRAPHX_INT8_CALIBRATION_TABLE_NAME",
              "migraphx_int8_use_native_calibration_table": "ORT_MIGRAPHX_INT8_USE_NATIVE_CALIBRATION_TABLE"},
    unknown_key_error="Invalid MIGraphX EP option: <key>", uses_calibration_table=False,
    sources=(Source(_MS, _PYBIND, "89746dc19a0a1ae59ebf4b16df9acab8f99f3925", "909-1022"),
             Source(_MS, _PYBIND, "c4fb724e810bb496165b9015c77f402727392933", "848-961"),
             Source(_MS, _EP_CC, "89746dc19a0a1ae59ebf4b16df9acab8f99f3925", "107-124, 150-157, 1166-1178, 187-191")),
    checked="source only")

#: A build older than 1.23 whose libraries could not tell the two parsers above apart: only what both accept.
#: Both providers read ORT_MIGRAPHX_FP16_ENABLE / _INT8_ENABLE / _EXHAUSTIVE_TUNE (AMD's lets them override the
#: options), so those settings travel as environment variables.
LEGACY_UNKNOWN = Flavour(
    name="legacy-unknown", title="ONNX Runtime < 1.23 with a MIGraphX EP whose parser could not be identified",
    keys=AMD_REL_1_22.keys & MICROSOFT_1_20.keys, true="True", false="False",
    env_only={k: v for k, v in MICROSOFT_1_20.env_only.items() if k in ("migraphx_fp16_enable", "migraphx_int8_enable",
                                                                          "migraphx_exhaustive_tune")},
    unknown_key_error="Invalid MIGraphX EP option: <key>", uses_calibration_table=False,
    sources=AMD_REL_1_22.sources[:1] + MICROSOFT_1_20.sources[:1], checked="source only")

FLAVOURS = (ORT_1_23, AMD_REL_1_22, MICROSOFT_1_20, LEGACY_UNKNOWN)

#: ORT_MIGRAPHX_* variables each flavour's provider reads (after the options, so they win where both exist).
ENV_OF = {
    "migraphx_fp16_enable": "ORT_MIGRAPHX_FP16_ENABLE", "migraphx_bf16_enable": "ORT_MIGRAPHX_BF16_ENABLE",
    "migraphx_fp8_enable": "ORT_MIGRAPHX_FP8_ENABLE", "migraphx_int8_enable": "ORT_MIGRAPHX_INT8_ENABLE",
    "migraphx_int8_calibration_table_name": "ORT_MIGRAPHX_INT8_CALIBRATION_TABLE_NAME",
    "migraphx_int8_use_native_calibration_table": "ORT_MIGRAPHX_INT8_USE_NATIVE_CALIBRATION_TABLE",
    "migraphx_exhaustive_tune": "ORT_MIGRAPHX_EXHAUSTIVE_TUNE", "migraphx_model_cache_dir": "ORT_MIGRAPHX_MODEL_CACHE_PATH",
}

SPEC = ProviderSpec(
    device="migraphx",
    provider="MIGraphXExecutionProvider",
    package=("onnxruntime-migraphx", "migraphx"),
    options=OPTIONS,
    newer_options=NEWER_OPTIONS,
    flavours=FLAVOURS,
    env_options=ENV_OF,
    # The MIGraphX EP has no graph-capture option: MIGraphX compiles the whole graph into one program itself.
    graph_option=None,
    # No caller's stream: no option of the EP's own parser names one (microsoft/onnxruntime
    # onnxruntime/core/providers/migraphx/migraphx_execution_provider_info.h at 03c125006fc8, vendored in
    # tests/engines/migraphx/upstream/ort_info_h_03c1250.txt), so serve's --streams shared is dropped here and
    # --streams serial (one run at a time, nothing asked of the provider) is the mode that applies.
    stream_option=None,
    # Precision switches the provider implements. INT8 is the exception in practice: the EP quantizes only with
    # a calibration table it never fills (engines/ort_ep_options.py), so migraphx/int8 runs a model whose graph
    # is already quantized (QDQ) and the switch is not passed; a float model is refused with the fix.
    native_precision={"fp16": {"migraphx_fp16_enable": "1"}, "int8": {"migraphx_int8_enable": "1"}},
    arena_keys=("migraphx_arena_extend_strategy", "migraphx_mem_limit"),
    # The MIGraphX EP re-parses and recompiles its program when an input's lengths differ from the compiled
    # program's (ROCm/onnxruntime onnxruntime/core/providers/migraphx/migraphx_execution_provider.cc at
    # 6ac4f7666aa4: "if (mgx_lens != ort_lens) ... input_shape_match = false" then "Input shape mismatch
    # detected. Recompiling"; vendored in tests/engines/migraphx/upstream/buckets_ep_recompile_ROCm_6ac4f76.txt).
    compiles_per_shape=True,
    tuning=(Knob("MIGraphX exhaustive tune", ({"migraphx_exhaustive_tune": "1"},)),),
    # The EP saves each compiled program as <hash>.mxr in the model cache folder and loads it on the next
    # session (migraphx_execution_provider.cc, model cache).
    compile_cache=CompileCache("migraphx", "mxr", "*.mxr", {"migraphx_model_cache_dir": "{dir}"}),
    example="migraphx:0/fp16",
    preference=10,
    vendor="amd",
    doctor_default=True,
    doctor_checks=("gpu", "gfx"),
    sources=(*(s for f in FLAVOURS[:3] for s in f.sources),
             f"{_AMD} {_EP_CC} @6ac4f7666aa4 (recompiles per input shape)",
             "microsoft/onnxruntime onnxruntime/core/providers/migraphx/migraphx_execution_provider_info.h "
             "@03c1250 L37-38 (NEWER_OPTIONS)"),
)
