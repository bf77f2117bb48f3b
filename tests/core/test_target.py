"""Target strings: parse, print back, provider options checked before any session is built."""

from __future__ import annotations

import pytest

from onnxaccel.errors import ProviderOptionError, TargetError
from onnxaccel.target import PROVIDER_OPTIONS, parse_target


@pytest.mark.parametrize("text", [
    "cpu", "cuda", "cuda:1", "migraphx:0/fp16", "rocm", "tensorrt/int8", "migraphx@migraphx",
    "cuda:0/fp16?enable_cuda_graph=1&prefer_nhwc=1", "cpu?intra_op_num_threads=2",
    "migraphx?migraphx_model_cache_dir=/var/cache/mgx",
])
def test_target_string_round_trips(text):
    target = parse_target(text)
    assert str(target) == text
    assert parse_target(str(target)) == target


def test_parse_reads_every_part():
    t = parse_target("cuda:1/fp16?prefer_nhwc=true")
    assert (t.device, t.device_id, t.precision, t.engine) == ("cuda", 1, "fp16", "ort")
    assert t.provider == "CUDAExecutionProvider"
    assert t.provider_options() == {"prefer_nhwc": "1", "device_id": "1"}


def test_overrides_from_the_command_line_win():
    t = parse_target("cuda/fp16", precision="fp32", options=["enable_cuda_graph=1"])
    assert t.precision == "fp32" and t.option_dict == {"enable_cuda_graph": "1"}


def test_migraphx_precision_maps_to_the_providers_own_switch():
    assert parse_target("migraphx/fp16").provider_options() == {"migraphx_fp16_enable": "1"}
    assert parse_target("migraphx:1/int8").provider_options() == {"migraphx_int8_enable": "1", "device_id": "1"}
    assert parse_target("migraphx/fp16").precision_is_native
    assert not parse_target("cuda/fp16").precision_is_native  # CUDA runs an FP16 *model*


def test_session_options_go_to_the_session_not_the_provider():
    t = parse_target("cpu", options=["intra_op_num_threads=3", "graph_optimization_level=basic"])
    assert t.provider_options() == {}
    assert t.session_options() == {"graph_optimization_level": "basic", "intra_op_num_threads": "3"}


def test_unknown_option_lists_valid_ones_and_suggests_the_closest():
    with pytest.raises(ProviderOptionError) as err:
        parse_target("cuda", options=["prefer_nchw=1"])
    assert "'prefer_nchw' is not an option of CUDAExecutionProvider" in err.value.message
    assert "Did you mean 'prefer_nhwc'?" in err.value.hint and "enable_cuda_graph" in err.value.hint


def test_option_of_another_provider_says_whose_it_is():
    with pytest.raises(ProviderOptionError, match="it is a migraphx option"):
        parse_target("cuda", options=["migraphx_fp16_enable=1"])


def test_cpu_provider_options_are_rejected_because_ort_would_drop_them():
    with pytest.raises(ProviderOptionError) as err:
        parse_target("cpu", options=["prefer_nhwc=1"])
    assert "drop them silently" in err.value.hint


def test_the_nonexistent_rocm_fp16_option_is_called_out():
    with pytest.raises(ProviderOptionError) as err:
        parse_target("migraphx", options=["ort.session.use_rocm_fp16=1"])
    assert "No such option exists" in err.value.hint and "migraphx_fp16_enable" in err.value.hint


@pytest.mark.parametrize("option,fragment", [
    ("enable_cuda_graph=maybe", "must be 0 or 1"),
    ("gpu_mem_limit=lots", "must be an integer"),
    ("cudnn_conv_algo_search=FASTEST", "EXHAUSTIVE, HEURISTIC, DEFAULT"),
    ("novalue", "Cannot read the option"),
])
def test_bad_option_values_are_rejected(option, fragment):
    with pytest.raises(ProviderOptionError, match=fragment):
        parse_target("cuda", options=[option])


def test_enum_values_are_normalized_case_insensitively():
    assert parse_target("cuda?cudnn_conv_algo_search=heuristic").option_dict == {"cudnn_conv_algo_search": "HEURISTIC"}


@pytest.mark.parametrize("text,fragment", [
    ("gpu", "Unknown target device 'gpu'"),
    ("cdua", "Did you mean 'cuda'"),
    ("cuda:x", "must be a number"),
    ("cpu:0", "takes no device id"),
    ("cuda/fp8", "Unknown precision 'fp8'"),
    ("cuda@tvm", "Unknown engine 'tvm'"),
    ("cuda@migraphx", "runs only on AMD GPUs"),
    ("", "empty"),
])
def test_malformed_targets_are_usage_errors(text, fragment):
    with pytest.raises(TargetError) as err:
        parse_target(text)
    assert fragment in str(err.value)
    assert err.value.exit_code == 2


def test_documented_migraphx_keys_are_known():
    # Keys from the onnxruntime-migraphx 1.27.1 binary (research/rocm_facts.md §2.1).
    for key in ("migraphx_fp16_enable", "migraphx_int8_enable", "migraphx_model_cache_dir",
                "migraphx_exhaustive_tune", "migraphx_int8_calibration_table_name"):
        assert key in PROVIDER_OPTIONS["migraphx"]
    # The removed save/load spellings are struct fields, not string keys: rejected.
    with pytest.raises(ProviderOptionError):
        parse_target("migraphx", options=["migraphx_save_compiled_model=1"])


def test_without_options_drops_only_the_named_keys():
    target = parse_target("cuda:0/fp16?enable_cuda_graph=1&prefer_nhwc=1")
    assert str(target.without_options("enable_cuda_graph")) == "cuda:0/fp16?prefer_nhwc=1"
    assert target.without_options("absent") == target


def test_every_key_a_migraphx_build_declares_can_be_written_in_a_target():
    # The target grammar is portable: it takes each key some build declares (engines/ort_flavour.py); the
    # session then passes it only where the installed build declares it.
    from onnxaccel.engines.ort_flavour import AMD_REL_1_22, MIGRAPHX_KEYS_AFTER_1_27, ORT_1_23
    from onnxaccel.target import _MIGRAPHX_NEWER

    assert set(_MIGRAPHX_NEWER) == MIGRAPHX_KEYS_AFTER_1_27
    values = {"bool": "1", "int": "0", "str": "/tmp/x"}
    for key in sorted(ORT_1_23.keys | AMD_REL_1_22.keys | MIGRAPHX_KEYS_AFTER_1_27):
        kind = {**PROVIDER_OPTIONS["migraphx"], **_MIGRAPHX_NEWER}[key]
        value = values.get(kind) if isinstance(kind, str) else kind[0]
        assert parse_target("migraphx", options=[f"{key}={value}"]).option_dict[key] == value
