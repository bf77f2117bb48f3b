"""Our tables of AMD facts held against the upstream source they come from (vendored in tests/system/upstream/,
each excerpt naming repository, path and commit): the messages of rocminfo and rocm-smi that we translate,
HIP's error codes and flag values, and what --gpu-wait does on ROCm as the HIP runtime's code decides it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from onnxaccel.cli.main import app
from onnxaccel.engines.gpu_runtime import HIP_ERRORS, PORTABLE as _PORTABLE
from onnxaccel.engines.hostmem import GPU_WAIT, GPU_WAIT_EFFECT
from onnxaccel.system.amd_diagnosis import ROCM_SMI_MESSAGES, ROCMINFO_MESSAGES, explain_rocm_smi, explain_rocminfo
from tests.system.tool_outputs import upstream

DOCS = Path(__file__).resolve().parents[2] / "docs"
ROCMINFO = ("rocminfo_rocm-5.2.3.txt", "rocminfo_c6f7a17.txt")
ROCM_SMI = ("rocm_smi_rocm-5.2.3.txt", "rocm_smi_rocm-6.2.0.txt")
HIP_API = ("hip_runtime_api_rocm-5.2.3.txt", "hip_runtime_api_rocm-6.2.0.txt")
SET_DEVICE_FLAGS = ("hip_set_device_flags_hipamd_rocm-5.2.3.txt", "hip_set_device_flags_clr_rocm-6.2.0.txt")


# -- rocminfo and rocm-smi: every message we translate is one the tool prints ------------------------------

def test_every_rocminfo_message_we_translate_is_in_rocminfos_source():
    texts = {name: upstream(name)[1] for name in ROCMINFO}
    for message in ROCMINFO_MESSAGES:
        found_in = [name for name, text in texts.items() if message.upstream in text]
        assert found_in, f"{message.upstream!r} is in no vendored rocminfo.cc"
        if message.code != "amd-driver-not-live":  # "NOT live" arrived after 5.2.3 (initstate check)
            assert len(found_in) == len(texts), (message.upstream, found_in)


@pytest.mark.parametrize("message", ROCMINFO_MESSAGES, ids=lambda m: m.code)
def test_each_rocminfo_message_as_printed_is_translated(message):
    """The printf format filled in as rocminfo fills it (colour codes included) is matched by our pattern."""
    values = {"Unable to open /dev/kfd read-write: %s": ("Permission denied",),
              'is not member of \\"%s\\" group': ("ada", "render"),
              "Call returned %s": ("HSA_STATUS_ERROR_OUT_OF_RESOURCES",)}.get(message.upstream, ())
    printed = message.upstream.replace('\\"', '"')
    if message.upstream.startswith("is not member"):
        printed = f"%s {printed}, the default DRM access group."
    printed = "\x1b[31m" + (printed % values) + "\x1b[0m\n"
    problem = explain_rocminfo(printed)
    assert problem is not None and problem.code == message.code
    assert problem.fix and problem.cause and problem.said.startswith("rocminfo: ")


def test_every_rocm_smi_message_we_translate_is_in_rocm_smis_source_and_the_driver_one_exits_0():
    for name in ROCM_SMI:
        text = upstream(name)[1]
        for message in ROCM_SMI_MESSAGES:
            assert f"logging.error('{message.upstream}'" in text, (name, message.upstream)
        # Why the backend reads stderr even when rocm-smi succeeds: it exits 0 after saying the driver is missing.
        assert "logging.error('Driver not initialized (amdgpu not found in modules)')\n        exit(0)" in text
    assert explain_rocm_smi("", "ERROR:root:ROCm SMI returned 8 (the expected value is 0)\n").code == \
        "amd-smi-init-failed"


def test_every_code_we_report_is_documented_in_troubleshooting():
    text = (DOCS / "TROUBLESHOOTING.md").read_text()
    for code in {m.code for m in ROCMINFO_MESSAGES + ROCM_SMI_MESSAGES}:
        assert f"`{code}`" in text, code


# -- HIP: error codes, flag values ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", HIP_API)
def test_hip_error_codes_and_flags_match_hip_runtime_api_h(name):
    text = upstream(name)[1]
    for code, (error, _) in HIP_ERRORS.items():
        assert re.search(rf"\b{error} = {code},", text), (error, code)
    assert f"#define hipHostRegisterPortable {_PORTABLE:#x}" in text
    assert f"#define hipDeviceScheduleBlockingSync {GPU_WAIT['block']:#x}" in text


def test_hip_schedule_flag_values_match():
    text = upstream("hip_runtime_api_rocm-6.2.0.txt")[1]
    for mode, flag in (("auto", "Auto"), ("spin", "Spin"), ("yield", "Yield"), ("block", "BlockingSync")):
        assert re.search(rf"#define hipDeviceSchedule{flag}\s+{GPU_WAIT[mode]:#x}\b", text), mode


# -- --gpu-wait on ROCm: what the runtime's code does, and what we say it does ----------------------------------

@pytest.mark.parametrize("name", SET_DEVICE_FLAGS)
def test_on_rocm_spin_and_yield_are_one_active_wait_and_block_is_not(name):
    text = upstream(name)[1]
    assert ("    case hipDeviceScheduleSpin:\n    case hipDeviceScheduleYield:\n"
            "      // The both options falls into yield, because MT usage in runtime\n"
            "      device->SetActiveWait(true);") in text
    assert "    case hipDeviceScheduleBlockingSync:\n      device->SetActiveWait(false);" in text
    hip = GPU_WAIT_EFFECT["hip"]
    assert hip["spin"].startswith("active wait") and hip["yield"].startswith("active wait")
    assert "sleep until the GPU signals" in hip["block"]


def test_the_blocking_wait_polls_100_us_then_suspends_and_the_default_is_active():
    wait = upstream("hip_wait_for_signal_clr_rocm-6.2.0.txt")[1]
    assert "kTimeout100us = 100 * K;" in wait  # K = 1000, nanoseconds
    assert "uint64_t timeout = kTimeout100us;\n    if (active_wait) {\n      timeout = kUnlimitedWait;" in wait
    assert "// Wait until the completion with CPU suspend" in wait and "HSA_WAIT_STATE_BLOCKED" in wait
    assert GPU_WAIT_EFFECT["hip"]["block"].startswith("poll for up to 100 us, then sleep")
    assert "devices[i]->SetActiveWait(true);" in upstream("hip_context_clr_rocm-6.2.0.txt")[1]
    assert GPU_WAIT_EFFECT["hip"]["auto"].startswith("active wait (the runtime's default)")


QUOTES = ("hipDeviceScheduleBlockingSync : On ROCm platform, this is a synonym for hipDeviceScheduleYield",
          "The both options falls into yield", "Wait until the completion with CPU suspend")


def test_what_the_help_text_says_about_rocm_is_what_the_source_says():
    """The API reference's claim (block = yield) is quoted as a claim; the behaviour stated is the code's."""
    assert QUOTES[0] in upstream("hip_runtime_api_rocm-6.2.0.txt")[1]
    assert QUOTES[0] in upstream("hip_runtime_api_rocm-5.2.3.txt")[1]
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "1000", "TERM": "dumb"})
    assert result.exit_code == 0
    help_text = " ".join(result.output.replace("│", " ").split())
    assert ("block (CUDA: sleep until the GPU signals; ROCm: poll up to 100 us, then sleep, per the HIP runtime's "
            "source, whose API reference calls it a synonym for yield)") in help_text
    assert "yield (ROCm: both an active wait)" in help_text


def test_serving_doc_quotes_the_source_verbatim_and_cites_its_commits():
    doc = " ".join((DOCS / "SERVING.md").read_text().split())
    sources = {"hip_runtime_api_rocm-6.2.0.txt": "is a synonym for hipDeviceScheduleYield",
               "hip_set_device_flags_clr_rocm-6.2.0.txt": QUOTES[1],
               "hip_wait_for_signal_clr_rocm-6.2.0.txt": QUOTES[2]}
    for name, quote in sources.items():
        source, text = upstream(name)
        assert quote in text and quote in doc, (name, quote)
    assert "`dd7f957`" in doc and "`02187ec`" in doc
    assert upstream("hip_set_device_flags_clr_rocm-6.2.0.txt")[0].split(" @ ")[1].startswith("dd7f957")
    assert upstream("hip_set_device_flags_hipamd_rocm-5.2.3.txt")[0].split(" @ ")[1].startswith("02187ec")
    row = next(line for line in (DOCS / "SERVING.md").read_text().splitlines() if line.startswith("| `block` |"))
    assert "polls the completion signal for up to 100 µs, then sleeps until the GPU signals" in row
    assert "synonym for yield" not in row  # the reference's claim is not what the table states
