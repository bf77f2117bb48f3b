"""Debian's own ROCm user-space binaries, run for real up to the missing GPU.

This machine has no AMD GPU and no amdgpu kernel module, so each tool stops at its driver check, and each
answer must reach the user as our error with its fix. The packages (Debian 12, ROCm 5.2.3), each test's needs:

* ``rocminfo`` (package rocminfo): exit 1, "ROCk module is NOT loaded, possibly no GPU devices" on stdout;
* ``rocm-smi`` (packages rocm-smi, librocm-smi64-1): exit 0, "Driver not initialized (amdgpu not found in
  modules)" on stderr, nothing on stdout;
* ``libamdhip64.so.5`` (package libamdhip64-5, with libhsa-runtime64-1): hipGetDeviceCount -> 100
  (hipErrorNoDevice), hipSetDevice / hipHostRegister / hipSetDeviceFlags / hipStreamCreateWithFlags -> 101
  (hipErrorInvalidDevice).

Where a package is absent, its tests skip and name the apt-get line. Where an amdgpu module is loaded, they skip
too: the answers asserted here are those of a machine without the driver.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from host_libraries import library_loads

from onnxaccel.engines.gpu_runtime import HIP_ERRORS
from onnxaccel.engines.hostmem import DeviceCopier, DeviceStream, HostMemory, is_pinned, pin, set_gpu_wait
from onnxaccel.system.amd_diagnosis import DRIVER_FIX, explain_rocm_smi, explain_rocminfo, plain
from onnxaccel.system.gpus_amd import discover_amd
from onnxaccel.system.telemetry_backends import BackendUnavailable, RocmSmiBackend, open_backends
from onnxaccel.system.tools import run_tool


DRIVER_LOADED = os.path.isdir("/sys/module/amdgpu")
pytestmark = pytest.mark.skipif(DRIVER_LOADED, reason="an amdgpu module is loaded here; these tests assert the "
                                                      "answers of a machine without it")
needs_rocminfo = pytest.mark.skipif(shutil.which("rocminfo") is None,
                                    reason="rocminfo not installed: apt-get install rocminfo")
needs_rocm_smi = pytest.mark.skipif(shutil.which("rocm-smi") is None,
                                    reason="rocm-smi not installed: apt-get install rocm-smi librocm-smi64-1")
needs_hip = pytest.mark.skipif(not library_loads("libamdhip64.so.5"),
                               reason="libamdhip64.so.5 not installed: apt-get install libamdhip64-5")

NOT_LOADED = "ROCk module is NOT loaded, possibly no GPU devices"
SMI_SAID = "Driver not initialized (amdgpu not found in modules)"


@pytest.fixture
def real_tools(monkeypatch, tmp_path):
    """The installed tools on PATH, no ROCm root (Debian puts them in /usr/bin), no GPU-hiding variables."""
    for name in list(os.environ):
        if name.startswith(("HSA_", "HIP_", "ROCR_", "CUDA_VISIBLE")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm"))


# -- rocminfo ------------------------------------------------------------------------------------------------

@needs_rocminfo
def test_rocminfo_says_the_driver_is_not_loaded_and_we_translate_it(real_tools):
    run = run_tool(["rocminfo"])
    assert run.returncode == 1 and NOT_LOADED in plain(run.stdout)
    assert "\x1b[31m" in run.stdout  # in red: the colour codes are stripped before matching
    problem = explain_rocminfo(run.stdout, run.stderr)
    assert problem is not None and problem.code == "amd-driver-not-loaded"
    assert problem.said == f"rocminfo: {NOT_LOADED}"
    assert str(problem).startswith(f"no AMD GPU visible: the amdgpu kernel driver is not loaded (rocminfo: {NOT_LOADED})")
    assert problem.fix == DRIVER_FIX and "/dev/kfd" in problem.fix and "modprobe amdgpu" in problem.fix


@needs_rocminfo
def test_the_amd_inventory_keeps_rocminfos_reason_not_the_noise_on_its_stderr(real_tools):
    """rocminfo 5.2 runs `lsmod`, whose complaint lands on stderr; the reason is on stdout."""
    inventory = discover_amd()
    assert inventory.gpus == [] and inventory.problem is not None
    assert inventory.problem.code == "amd-driver-not-loaded"
    [note] = [n for n in inventory.notes if n.startswith("rocminfo:")]
    assert note == f"rocminfo: no AMD GPU visible: the amdgpu kernel driver is not loaded (rocminfo: {NOT_LOADED})"
    assert inventory.to_dict()["problem"]["fix"] == DRIVER_FIX


@needs_rocminfo
def test_doctor_target_migraphx_says_why_no_amd_gpu_is_visible_and_how_to_fix_it(real_tools):
    proc = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", "doctor", "--target", "migraphx", "--json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    [finding] = [f for f in report["findings"] if f["code"] == "amd-driver-not-loaded"]
    assert finding["severity"] == "error"  # an AMD target was asked for
    assert finding["title"] == "No AMD GPU visible: the amdgpu kernel driver is not loaded"
    assert finding["detail"] == f"rocminfo: {NOT_LOADED}" and finding["fix"] == DRIVER_FIX
    [verdict] = report["targets"]
    assert verdict["target"] == "migraphx" and verdict["ready"] is False
    assert any(NOT_LOADED in w and "see finding amd-driver-not-loaded" in w for w in verdict["warnings"])
    assert report["gpus"]["amd"]["problem"]["code"] == "amd-driver-not-loaded"


@needs_rocminfo
def test_doctor_human_output_shows_the_reason_and_the_fix(real_tools):
    proc = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", "doctor", "--target", "migraphx"],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "COLUMNS": "400"})
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    flat = " ".join(proc.stdout.split())
    assert "No AMD GPU visible: the amdgpu kernel driver is not loaded" in flat
    assert "sudo modprobe amdgpu" in flat and "--device=/dev/kfd" in flat


# -- rocm-smi ------------------------------------------------------------------------------------------------

@needs_rocm_smi
def test_rocm_smi_exits_0_with_its_reason_on_stderr_and_we_translate_it(real_tools):
    run = run_tool(["rocm-smi", "--showproductname", "--json"])
    assert run.returncode == 0 and run.stdout.strip() == "" and SMI_SAID in run.stderr
    problem = explain_rocm_smi(run.stdout, run.stderr)
    assert problem is not None and problem.code == "amd-driver-not-loaded"
    assert problem.said == f"rocm-smi: {SMI_SAID}" and problem.fix == DRIVER_FIX


@needs_rocm_smi
def test_the_rocm_smi_telemetry_backend_reports_the_driver_not_empty_json(real_tools):
    with pytest.raises(BackendUnavailable) as info:
        RocmSmiBackend().open()
    message = str(info.value)
    assert message.startswith("no AMD GPU visible: the amdgpu kernel driver is not loaded or not initialized "
                              f"(rocm-smi: {SMI_SAID}). Fix: ")
    assert "JSON" not in message


@needs_rocm_smi
def test_monitor_names_the_driver_as_the_reason_there_is_nothing_to_read(real_tools):
    opened, notes = open_backends()
    assert opened == []
    assert any(n.startswith("rocm-smi: no AMD GPU visible") and SMI_SAID in n for n in notes)
    proc = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", "monitor", "--count", "1"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "COLUMNS": "400"})
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert SMI_SAID in " ".join((proc.stdout + proc.stderr).split())


# -- the HIP runtime (libamdhip64.so.5) -----------------------------------------------------------------------

#: The translated refusal; the library is named as loaded (its soname, or its path once the process has it).
NO_GPU = (r"no AMD GPU visible to \S*libamdhip64\.so\.5\S* \(hipGetDeviceCount: error 100 hipErrorNoDevice\): the "
          r"amdgpu kernel driver is not loaded \(/sys/module/amdgpu is absent\)\. Fix: install and load the amdgpu "
          r"kernel driver")


def _refused(call: str, text: str) -> bool:
    return re.match(re.escape(f"{call} failed: error 101 (hipErrorInvalidDevice): ") + NO_GPU, text) is not None


@needs_hip
def test_the_hip_runtime_answers_with_the_codes_and_names_of_our_table():
    hip = ctypes.CDLL("libamdhip64.so.5")
    hip.hipGetErrorName.restype = ctypes.c_char_p
    for code, (name, _) in HIP_ERRORS.items():
        assert hip.hipGetErrorName(code).decode() == name
    count = ctypes.c_int(-1)
    assert hip.hipGetDeviceCount(ctypes.byref(count)) == 100 and count.value == 0
    buffer = np.zeros(8192, np.uint8)
    hip.hipHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    assert hip.hipHostRegister(buffer.ctypes.data, 4096, 1) == 101
    hip.hipGetLastError()


HOST_BUFFERS = """
import json, numpy as np
from onnxaccel.engines.hostmem import HostMemory
host = HostMemory("hip")
buffer = host.buffer("x", (3, 4), np.float32)
buffer[...] = 1.0
print(json.dumps({"sum": float(buffer.sum()), **host.describe()}))
"""


@needs_hip
def test_host_buffers_find_the_so5_runtime_and_say_no_amd_gpu_is_visible_with_the_fix():
    """In a fresh process, where nothing has loaded a HIP runtime yet: the search itself finds the soname."""
    proc = subprocess.run([sys.executable, "-c", HOST_BUFFERS], capture_output=True, text=True, timeout=120,
                          check=True)
    described = json.loads(proc.stdout)
    assert described["sum"] == 12 and described["pinned"] is False
    reason = described["reason"]
    assert _refused("hipHostRegister", reason) and "visible to libamdhip64.so.5 (" in reason, reason
    assert "/dev/kfd" in reason and "onnxaccel doctor --target migraphx" in reason


@needs_hip
def test_host_buffers_in_a_process_that_has_the_runtime_use_it():
    """Where the GPU provider already loaded libamdhip64 (here: loaded by hand), that one is used."""
    ctypes.CDLL("libamdhip64.so.5")
    host = HostMemory("hip")
    host.buffer("x", (2, 2), np.float32)
    assert _refused("hipHostRegister", host.describe()["reason"]), host.describe()["reason"]


@needs_hip
def test_pinning_and_device_copies_refuse_with_the_runtimes_codes_and_the_fix():
    arena = mmap.mmap(-1, 1 << 16)
    flat = np.frombuffer(arena, dtype=np.uint8)
    try:
        reason = pin("hip", flat.ctypes.data, flat.nbytes)
        assert _refused("hipHostRegister", reason), reason
        assert not is_pinned(flat.ctypes.data, 16)
        try:
            DeviceCopier("hip").copy([(0, [(flat.ctypes.data, 16)])])
            copied = ""
        except RuntimeError as exc:  # not pytest.raises: its traceback would keep the arena exported
            copied = str(exc)
        assert _refused("hipStreamCreateWithFlags", copied), copied
    finally:
        del flat
        arena.close()


@needs_hip
def test_a_stream_for_shared_instances_is_refused_by_the_runtime_with_the_reason():
    """serve --streams shared makes one stream per model (engines/hostmem.py DeviceStream): without an AMD GPU
    the HIP runtime refuses it, and the reason says why and how to fix it."""
    with pytest.raises(RuntimeError) as refused:
        DeviceStream("hip")
    assert _refused("hipStreamCreateWithFlags", str(refused.value)), str(refused.value)


@needs_hip
def test_gpu_wait_on_rocm_is_refused_by_the_runtime_with_the_reason():
    note = set_gpu_wait("hip", 0, "block")
    assert note.startswith("the HIP runtime refused: ") and _refused("hipSetDevice", note.split(": ", 1)[1]), note
