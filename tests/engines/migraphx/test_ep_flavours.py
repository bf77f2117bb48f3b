"""ONNX Runtime flavours on AMD: the option tables held against upstream text, build detection from library
bytes, each session's options spelled for its build, and INT8 on the MIGraphX EP only where the graph proves it.

NOT EXECUTED ON AMD HARDWARE. Upstream text is vendored in upstream/ort_*.txt (repository, path, commit in
each header; "N: text" lines are line N of that file, verbatim). The PyPI wheels' strings were read here with
strings/nm (upstream/ort_wheel_*.txt); AMD's per-release builds and Microsoft's v1.20-v1.22.1 tags are held
against source only. Fake libraries below are files holding those strings: enough for detection, which reads
bytes and loads nothing.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from model_builders import make_mlp
from onnxaccel.engines.ort_ep_options import (
    calibration_table_refusal,
    check_int8_source,
    ep_environment,
    migraphx_options,
    quantized_nodes,
)
from onnxaccel.engines.ort_flavour import (
    AMD_REL_1_22,
    ENV_OF,
    LEGACY_UNKNOWN,
    MICROSOFT_1_20,
    MIGRAPHX_KEYS_AFTER_1_27,
    ORT_1_23,
    PARSERS,
    ROCM_EP_SOURCE,
    detect,
)
from onnxaccel.errors import ProviderOptionError, ProviderUnavailableError, TargetError
from onnxaccel.target import PROVIDER_OPTIONS, parse_target

UPSTREAM = Path(__file__).parent / "upstream"
#: Local git snapshots of the upstream repositories (the `fetch` tool's), where this machine has them.
MIRRORS = {"ROCm/onnxruntime": Path("/work/.mirror/ROCm+onnxruntime/repo"),
           "microsoft/onnxruntime": Path("/work/.mirror/ROCm+onnxruntime/repo"),  # its tags are in AMD's fork
           "ROCm/AMDMIGraphX": Path("/work/.mirror/ROCm+AMDMIGraphX/repo")}


# -- vendored upstream text -------------------------------------------------------------------------------

def snippet(name: str) -> tuple[dict[str, str], dict[int, str]]:
    """(header fields, {line number: exact text}) of upstream/<name>."""
    head, lines = {}, {}
    for raw in (UPSTREAM / name).read_text().splitlines():
        if raw.startswith("# "):
            key, _, value = raw[2:].partition(": ")
            head[key] = value
        else:
            number, text = re.fullmatch(r"(\d+): ?(.*)", raw).groups()
            lines[int(number)] = text
    return head, lines


def wheel_strings(version: str) -> set[str]:
    return {line for line in (UPSTREAM / f"ort_wheel_onnxruntime_migraphx-{version}.txt").read_text().splitlines()
            if line and not line.startswith("#")}


def binding_parser(name: str, names_from: str | None = None) -> tuple[set[str], set[str]]:
    """The keys a Python binding's MIGraphX branch compares, and the value literals it accepts for booleans."""
    constants = {}
    if names_from:
        for text in snippet(names_from)[1].values():
            found = re.search(r'constexpr auto (k\w+) = "([^"]+)"', text)
            if found:
                constants[found.group(1)] = found.group(2)
    keys, values = set(), set()
    for text in snippet(name)[1].values():
        literal = re.search(r'option\.first == "([^"]+)"', text)
        named = re.search(r"option\.first == migraphx_provider_option::(k\w+)", text)
        if literal:
            keys.add(literal.group(1))
        if named:
            keys.add(constants[named.group(1)])
        values |= set(re.findall(r'option\.second == "([^"]+)"', text))
    return keys, values


AMD_BINDINGS = ("ort_pybind_rel-1.22.1_migraphx.txt", "ort_pybind_rocm7.0_migraphx.txt")
MS_BINDINGS = ("ort_pybind_v1.20.0_migraphx.txt", "ort_pybind_v1.22.1_migraphx.txt")


@pytest.mark.parametrize("name", AMD_BINDINGS)
def test_amd_release_table_is_the_keys_and_booleans_of_its_binding(name):
    keys, values = binding_parser(name, "ort_info_h_rel-1.22.1.txt")
    assert keys == AMD_REL_1_22.keys
    assert values == {"True", "true", "False", "false"}
    assert {AMD_REL_1_22.true, AMD_REL_1_22.false} <= values and "1" not in values  # what broke migraphx/fp16
    assert any('ORT_THROW("Invalid MIGraphX EP option: "' in t for t in snippet(name)[1].values())
    assert "Invalid MIGraphX EP option" in AMD_REL_1_22.unknown_key_error


@pytest.mark.parametrize("name", MS_BINDINGS)
def test_microsoft_1_20_table_is_the_keys_and_booleans_of_its_binding(name):
    keys, values = binding_parser(name)
    assert keys == MICROSOFT_1_20.keys
    assert {MICROSOFT_1_20.true, MICROSOFT_1_20.false} <= values and "1" not in values
    # The native-table key has another name there than in every later build.
    assert "migraphx_use_native_calibration_table" in keys and "migraphx_int8_use_native_calibration_table" not in keys


def test_microsoft_1_20_provider_takes_precision_and_tuning_only_from_the_environment():
    _, ctor = snippet("ort_ep_ctor_v1.22.1.txt")
    _, header = snippet("ort_ep_h_v1.22.1.txt")
    variables = dict(re.findall(r'static const char (\w+)\[\] = "(ORT_MIGRAPHX_\w+)"', "\n".join(header.values())))
    body = "\n".join(ctor.values())
    assert "info." not in body.replace("info.device_id", "").replace("info.target_device", "")
    for key, member, constant in (("migraphx_fp16_enable", "fp16_enable_", "kFP16Enable"),
                                  ("migraphx_int8_enable", "int8_enable_", "kINT8Enable"),
                                  ("migraphx_exhaustive_tune", "exhaustive_tune_", "kExhaustiveTune")):
        assert f"migraphx_env_vars::{constant})" in body and f"{member} = (std::stoi(" in body
        assert MICROSOFT_1_20.env_only[key] == variables[constant]


def test_legacy_unknown_sends_only_what_both_pre_1_23_builds_take():
    assert LEGACY_UNKNOWN.keys == AMD_REL_1_22.keys & MICROSOFT_1_20.keys
    assert LEGACY_UNKNOWN.true in binding_parser(AMD_BINDINGS[0], "ort_info_h_rel-1.22.1.txt")[1]
    assert LEGACY_UNKNOWN.true in binding_parser(MS_BINDINGS[1])[1]


@pytest.mark.parametrize("version", ["1.23.2", "1.27.1"])
def test_ort_1_23_table_is_the_option_names_in_the_pypi_wheels(version):
    strings = wheel_strings(version)
    head = (UPSTREAM / f"ort_wheel_onnxruntime_migraphx-{version}.txt").read_text()
    assert "'Invalid MIGraphX EP option': no" in head  # the binding no longer parses MIGraphX options
    assert {s for s in strings if not s.startswith("ORT_")} == ORT_1_23.keys
    assert set(ENV_OF.values()) <= strings and not MIGRAPHX_KEYS_AFTER_1_27 & strings


def test_keys_after_1_27_come_from_microsoft_main():
    _, lines = snippet("ort_info_h_03c1250.txt")
    names = set(re.findall(r'= "([^"]+)"sv', "\n".join(lines.values())))
    assert names == ORT_1_23.keys | MIGRAPHX_KEYS_AFTER_1_27
    assert "migraphx_max_dynamic_batch" in lines[37] and "migraphx_max_compiled_models" in lines[38]


def test_the_migraphx_ep_takes_no_callers_stream_so_serve_drops_shared_and_keeps_serial():
    """No option of the EP's own parser names a stream (the vendored key list at microsoft/onnxruntime 03c1250):
    the spec has no stream_option, serve's plan drops --streams shared on MIGraphX with the reason and keeps
    --streams serial, which needs nothing from the provider."""
    from onnxaccel.plan import Host, PlanRequest, plan_execution
    from onnxaccel import providers

    _, lines = snippet("ort_info_h_03c1250.txt")
    names = set(re.findall(r'= "([^"]+)"sv', "\n".join(lines.values())))
    assert names and not any("stream" in name for name in names)
    assert providers.get("migraphx").stream_option is None
    assert providers.get("cuda").stream_option == "user_compute_stream"
    for asked, ran in (("shared", "own"), ("serial", "serial")):
        plan = plan_execution(parse_target("migraphx"), PlanRequest(command="serve", max_batch=64, instances=2,
                                                                    streams=asked), host=Host(cores=16))
        assert plan.streams == ran


def test_booleans_we_send_to_self_parsing_providers_are_what_parse_string_accepts():
    _, lines = snippet("ort_parse_string_v1.22.1.txt")
    assert '"0"' in lines[81] and '"1"' in lines[86]
    assert (ORT_1_23.true, ORT_1_23.false) == ("1", "0")


def test_rocm_ep_option_names_are_the_target_grammar():
    _, lines = snippet("ort_rocm_info_v1.22.1.txt")
    names = set(re.findall(r'= "([^"]+)";', "\n".join(lines.values())))
    assert names == set(PROVIDER_OPTIONS["rocm"])


def test_int8_citations_in_the_errors_are_the_quoted_lines():
    _, amd = snippet("ort_ep_int8_rel-1.22.1.txt")
    _, ms = snippet("ort_ep_int8_v1.22.1.txt")
    _, ms_header = snippet("ort_ep_h_v1.22.1.txt")
    assert "if ((int8_enable xor fp8_enable) && int8_calibration_cache_available) {" in amd[1291]
    assert "std::unordered_map<std::string, float> dynamic_range_map;" in amd[162]  # a local
    assert "dynamic_range_map_);" in amd[1445]  # the member that quantize_int8 receives
    assert "if (int8_enable_ && int8_calibration_cache_available_) {" in ms[1167]
    assert "std::unordered_map<std::string, float> dynamic_range_map;" in ms[151]
    assert ": dynamic_range_map_) {" in ms[1175] and "dynamic_range_map_;" in ms_header[99]
    text = str(calibration_table_refusal())
    for cited in ("L151/L1175", "L162/L1445"):
        assert cited in text
    assert not any(p.uses_calibration_table for p in PARSERS)


def _cited_lines(lines: str) -> list[int]:
    out = []
    for part in lines.split(","):
        first, _, last = part.strip().partition("-")
        out += [int(first), int(last or first)]
    return out


@pytest.mark.parametrize("source", sorted({s for p in PARSERS for s in p.sources if "/" in s.repo and "PyPI" not in s.repo}
                                          | {ROCM_EP_SOURCE}, key=str), ids=str)
def test_every_cited_source_is_held_by_a_vendored_snippet(source):
    held = []
    for path in UPSTREAM.glob("ort_*.txt"):
        if "wheel" in path.name:
            continue
        head, lines = snippet(path.name)
        if head.get("path") == source.path and head.get("commit", "").startswith(source.commit):
            held.append(lines)
    assert held, f"no upstream/ort_*.txt vendors {source}"
    numbers = set().union(*(set(lines) for lines in held))
    assert set(_cited_lines(source.lines)) <= numbers


@pytest.mark.parametrize("name", sorted(p.name for p in UPSTREAM.glob("ort_*.txt") if "wheel" not in p.name
                                        and "03c1250" not in p.name))
def test_snippets_are_verbatim_upstream(name):
    head, lines = snippet(name)
    mirror = MIRRORS[head["repo"]]
    if not mirror.is_dir():
        pytest.skip(f"no local snapshot of {head['repo']} on this machine")
    commit = head["commit"].split()[0]
    text = subprocess.run(["git", "-C", str(mirror), "show", f"{commit}:{head['path']}"], capture_output=True,
                          text=True, check=True).stdout.splitlines()
    assert {n: text[n - 1] for n in lines} == lines


def test_migraphx_turns_a_qdq_graph_into_int8_ops_on_the_gpu():
    import onnxaccel.engines.ort_ep_options as module

    assert "simplify_qdq{" in snippet("ort_mgx_gpu_target_f729a52.txt")[1][129]
    _, lines = snippet("ort_mgx_simplify_qdq_f729a52.txt")
    assert '"quant_convolution"' in lines[175] and '"quant_dot"' in lines[227]
    assert "target.cpp L129 @ f729a52" in module.__doc__ and "simplify_qdq.cpp L175, L227" in module.__doc__


# -- detection from the libraries' bytes ------------------------------------------------------------------

def fake_capi(tmp_path: Path, *, provider: set[str] | None, pybind: set[str], name: str = "capi") -> Path:
    """A capi folder whose libraries hold ``provider`` / ``pybind`` as NUL-terminated strings."""
    capi = tmp_path / name
    capi.mkdir()

    def library(strings: set[str]) -> bytes:
        return b"\x7fELF\x02\x01\x01" + b"\x00".join(s.encode() for s in sorted(strings)) + b"\x00"

    (capi / "onnxruntime_pybind11_state.so").write_bytes(library(pybind | {"MIGraphXExecutionProvider"}))
    if provider is not None:
        (capi / "libonnxruntime_providers_migraphx.so").write_bytes(library(provider))
    return capi


def amd_binding_strings(*, bf16: bool = True) -> set[str]:
    keys = {k for k in AMD_REL_1_22.keys if bf16 or k != "migraphx_bf16_enable"}
    return keys | {"Invalid MIGraphX EP option: ",
                   "[ERROR] [MIGraphX] The value for the key 'migraphx_use_native_calibration_table' should be"}


def ms_binding_strings() -> set[str]:
    return set(MICROSOFT_1_20.keys) | {"Invalid MIGraphX EP option: "}


@pytest.mark.parametrize("version", ["1.23.2", "1.27.1"])
def test_a_1_23_build_is_read_from_its_provider_library(tmp_path, version):
    build = detect(fake_capi(tmp_path, provider=wheel_strings(version) | {"migraphx_program_compile"}, pybind=set()),
                   "onnxruntime-migraphx", version)
    assert build.migraphx is ORT_1_23 and build.migraphx_keys == ORT_1_23.keys
    assert "libonnxruntime_providers_migraphx.so" in build.evidence
    assert not build.declares("migraphx_max_dynamic_batch")


def test_amd_and_microsoft_builds_are_told_apart_by_their_binding(tmp_path):
    amd = detect(fake_capi(tmp_path, provider={"device_id"}, pybind=amd_binding_strings(), name="amd"), "onnxruntime-rocm",
                 "1.22.1")
    rocm64 = detect(fake_capi(tmp_path, provider=set(), pybind=amd_binding_strings(bf16=False), name="r64"))
    ms = detect(fake_capi(tmp_path, provider=set(), pybind=ms_binding_strings(), name="ms"), "onnxruntime-migraphx",
                "1.22.1")
    assert amd.migraphx is AMD_REL_1_22 and amd.migraphx_keys == AMD_REL_1_22.keys
    assert rocm64.migraphx is AMD_REL_1_22 and "migraphx_bf16_enable" not in rocm64.migraphx_keys
    assert ms.migraphx is MICROSOFT_1_20 and ms.migraphx_keys == MICROSOFT_1_20.keys
    # The error text that quotes the old key is not the key: substrings of longer strings do not count.
    assert "migraphx_use_native_calibration_table" not in amd.migraphx_keys


def test_a_build_without_the_migraphx_provider_has_no_migraphx_parser(tmp_path):
    build = detect(fake_capi(tmp_path, provider=None, pybind=set()), "onnxruntime", "1.32.0")
    assert build.migraphx is None and "no MIGraphX EP" in build.describe()[1]


@pytest.mark.parametrize(("version", "parser"), [("1.27.1", ORT_1_23), ("1.22.1", LEGACY_UNKNOWN)])
def test_without_libraries_the_version_decides_cautiously(version, parser):
    build = detect(None, "onnxruntime-migraphx", version)
    assert build.migraphx is parser and build.evidence == "package metadata only" and build.notes


def test_unreadable_names_fall_back_to_the_parsers_table(tmp_path):
    # Names inlined as fragments (as in the ROCm EP binary): the library holds no whole key strings.
    build = detect(fake_capi(tmp_path, provider={"device_i", "migraphx_fp16_e"}, pybind=set()), "onnxruntime-migraphx",
                   "1.27.1")
    assert build.migraphx_keys == ORT_1_23.keys and "could not be read" in build.notes[0]


# -- each session's options, spelled for its build --------------------------------------------------------

@pytest.fixture
def builds(tmp_path):
    return {
        "ort-1.23+": detect(fake_capi(tmp_path, provider=wheel_strings("1.27.1"), pybind=set(), name="g")),
        "amd-rel-1.22": detect(fake_capi(tmp_path, provider=set(), pybind=amd_binding_strings(), name="a")),
        "microsoft-1.20-1.22": detect(fake_capi(tmp_path, provider=set(), pybind=ms_binding_strings(), name="m")),
        "legacy-unknown": detect(None, "onnxruntime-migraphx", "1.21.0"),
    }


def binding_accepts(parser_name: str, options: dict[str, str]) -> None:
    """Run options through the vendored binding's comparisons: what the real parser would throw, we throw."""
    names = {"amd-rel-1.22": (AMD_BINDINGS[0], "ort_info_h_rel-1.22.1.txt"), "microsoft-1.20-1.22": (MS_BINDINGS[1], None)}
    keys, booleans = binding_parser(*names[parser_name])
    for key, value in options.items():
        assert key in keys, f"Invalid MIGraphX EP option: {key}"
        if key != "device_id" and "table_name" not in key and "path" not in key and "dir" not in key:
            assert value in booleans, f"The value for the key '{key}' should be 'True' or 'False'"


TARGETS = ["migraphx/fp16", "migraphx:0/fp16?migraphx_exhaustive_tune=1", "migraphx?migraphx_exhaustive_tune=0",
           "migraphx:1"]


@pytest.mark.parametrize("text", TARGETS)
@pytest.mark.parametrize("flavour", ["amd-rel-1.22", "microsoft-1.20-1.22"])
def test_legacy_bindings_accept_every_option_we_send(builds, flavour, text):
    binding_accepts(flavour, migraphx_options(parse_target(text), builds[flavour]).options)


def test_fp16_is_spelled_per_build(builds):
    target = parse_target("migraphx:0/fp16?migraphx_exhaustive_tune=1")
    spelled = {name: migraphx_options(target, build) for name, build in builds.items()}
    assert spelled["ort-1.23+"].options == {"device_id": "0", "migraphx_fp16_enable": "1", "migraphx_exhaustive_tune": "1"}
    assert spelled["amd-rel-1.22"].options == {"device_id": "0", "migraphx_fp16_enable": "True",
                                               "migraphx_exhaustive_tune": "True"}
    for name in ("microsoft-1.20-1.22", "legacy-unknown"):
        assert spelled[name].options == {"device_id": "0"}
        assert spelled[name].env == {"ORT_MIGRAPHX_FP16_ENABLE": "1", "ORT_MIGRAPHX_EXHAUSTIVE_TUNE": "1"}
    assert not spelled["ort-1.23+"].env and not spelled["amd-rel-1.22"].env


def test_keys_a_build_lacks_are_refused_before_onnx_runtime_sees_them(builds):
    with pytest.raises(ProviderOptionError) as err:
        migraphx_options(parse_target("migraphx?migraphx_mem_limit=1000000"), builds["amd-rel-1.22"])
    assert "does not declare the MIGraphX option 'migraphx_mem_limit'" in err.value.message
    assert "Invalid MIGraphX EP option" in err.value.message and "Drop -o migraphx_mem_limit" in err.value.hint


@pytest.mark.parametrize("key", sorted(MIGRAPHX_KEYS_AFTER_1_27))
def test_keys_newer_than_the_build_are_refused_and_passed_where_declared(tmp_path, builds, key):
    with pytest.raises(ProviderOptionError, match="after 1.27.1"):
        migraphx_options(parse_target(f"migraphx?{key}=4"), builds["ort-1.23+"])
    newer = detect(fake_capi(tmp_path, provider=wheel_strings("1.27.1") | {key}, pybind=set(), name="new"))
    assert migraphx_options(parse_target(f"migraphx?{key}=4"), newer).options == {key: "4"}


def test_the_program_cache_is_dropped_with_a_note_where_the_build_has_none(builds):
    target = parse_target("migraphx?migraphx_model_cache_dir=/var/cache/mxr")
    ms = migraphx_options(target, builds["microsoft-1.20-1.22"])
    assert ms.options == {} and "not cached" in ms.notes[0]
    assert migraphx_options(target, builds["amd-rel-1.22"]).options == {"migraphx_model_cache_dir": "/var/cache/mxr"}


def test_an_environment_variable_that_overrides_an_option_is_reported(builds, monkeypatch):
    monkeypatch.setenv("ORT_MIGRAPHX_FP16_ENABLE", "0")
    notes = migraphx_options(parse_target("migraphx/fp16"), builds["ort-1.23+"]).notes
    assert any("ORT_MIGRAPHX_FP16_ENABLE=0 is set in the environment and overrides" in n for n in notes)


def test_environment_settings_hold_while_the_session_is_built_and_are_restored(monkeypatch):
    monkeypatch.setenv("ORT_MIGRAPHX_EXHAUSTIVE_TUNE", "0")
    monkeypatch.delenv("ORT_MIGRAPHX_FP16_ENABLE", raising=False)
    import os

    with ep_environment({"ORT_MIGRAPHX_FP16_ENABLE": "1", "ORT_MIGRAPHX_EXHAUSTIVE_TUNE": "1"}):
        assert os.environ["ORT_MIGRAPHX_FP16_ENABLE"] == "1" and os.environ["ORT_MIGRAPHX_EXHAUSTIVE_TUNE"] == "1"
    assert "ORT_MIGRAPHX_FP16_ENABLE" not in os.environ and os.environ["ORT_MIGRAPHX_EXHAUSTIVE_TUNE"] == "0"


# -- INT8: labelled int8 only when the graph proves it ----------------------------------------------------

@pytest.fixture(scope="module")
def float_and_qdq(tmp_path_factory):
    """The MLP, and the same model quantized to QDQ by ONNX Runtime's static quantizer (real calibration runs)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    folder = tmp_path_factory.mktemp("int8")
    source = make_mlp(folder / "mlp.onnx", batch=1)

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.items = iter([{"x": rng.standard_normal((1, 4)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.items, None)

    qdq = folder / "mlp.qdq.onnx"
    quantize_static(str(source), str(qdq), Reader(), quant_format=QuantFormat.QDQ)
    return source, qdq


def test_migraphx_int8_on_a_float_model_is_refused_with_the_fix(float_and_qdq):
    from onnxaccel.engines.ort import OrtEngine
    from onnxaccel.model import load_model

    with pytest.raises(TargetError) as err:
        OrtEngine().compile(load_model(str(float_and_qdq[0])), parse_target("migraphx/int8"))
    assert "would not run INT8" in err.value.message and "L1291" in err.value.message
    assert "onnxaccel optimize MODEL --int8 static" in err.value.hint


def test_a_qdq_model_gets_past_the_int8_check(float_and_qdq):
    from onnxaccel.engines.ort import OrtEngine
    from onnxaccel.model import load_model

    model = load_model(str(float_and_qdq[1]))
    found = check_int8_source(parse_target("migraphx/int8"), model.proto)
    assert found["QuantizeLinear"] >= 1 and found["DequantizeLinear"] >= 2
    with pytest.raises(ProviderUnavailableError):  # this machine's onnxruntime has no MIGraphX EP: next check
        OrtEngine().compile(model, parse_target("migraphx/int8"))


def test_a_qdq_model_runs_without_the_inert_int8_switch(float_and_qdq, builds):
    proto = onnx.load(str(float_and_qdq[1]))
    for name, build in builds.items():
        ep = migraphx_options(parse_target("migraphx/int8"), build, proto)
        assert "migraphx_int8_enable" not in ep.options and "ORT_MIGRAPHX_INT8_ENABLE" not in ep.env, name
        assert any("QuantizeLinear x" in n for n in ep.notes)


def test_an_int8_switch_on_a_float_model_is_dropped_with_a_note(float_and_qdq, builds):
    ep = migraphx_options(parse_target("migraphx?migraphx_int8_enable=1"), builds["ort-1.23+"],
                          onnx.load(str(float_and_qdq[0])))
    assert ep.options == {} and "does no INT8" in ep.notes[0]


@pytest.mark.parametrize("flavour", ["ort-1.23+", "amd-rel-1.22", "microsoft-1.20-1.22", "legacy-unknown"])
def test_the_calibration_table_path_is_refused_on_every_build(builds, flavour, tmp_path):
    target = parse_target("migraphx/int8", options=[f"migraphx_int8_calibration_table_name={tmp_path / 't'}"])
    with pytest.raises(ProviderOptionError, match="calibrate on uninitialized values"):
        migraphx_options(target, builds[flavour])


def test_optimize_native_table_for_migraphx_is_refused_and_tensorrt_still_writes(tmp_path):
    from onnxaccel.transform.calibration_table import write_table

    with pytest.raises(ProviderOptionError) as err:
        write_table({"x": 1.0}, tmp_path / "m", parse_target("migraphx/int8"))
    assert "--int8 static" in err.value.hint and not (tmp_path / "m").exists()
    assert write_table({"x": 1.0}, tmp_path / "t", parse_target("tensorrt/int8")).path.exists()


def test_quantized_nodes_counts_only_quantization_ops(float_and_qdq):
    assert not quantized_nodes(onnx.load(str(float_and_qdq[0])))


# -- doctor -----------------------------------------------------------------------------------------------

def test_doctor_reports_the_build_and_what_it_means():
    import json

    from typer.testing import CliRunner

    from onnxaccel.cli.main import app

    result = CliRunner().invoke(app, ["doctor", "--target", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    build = json.loads(result.stdout)["ort_build"]
    assert build["version"] and build["evidence"].startswith("the libraries in")
    assert build["migraphx"] is None and "no MIGraphX EP in this build" in build["meaning"]
    text = CliRunner().invoke(app, ["doctor", "--target", "cpu"], env={"COLUMNS": "200"}).output
    assert "Build" in text and "no MIGraphX EP in this build" in text
