"""engines/prewarm.py: a GPU provider's libraries load in a background thread while a command starts (issue 36).

No GPU here: the CUDA spec's warm-up is checked to skip (not fail) on a CPU-only build, and the wiring of `run`,
`bench` and `batch` through a CPU spec given a ``prewarm`` for the test (a real ORT session of the tiny model).
"""

from __future__ import annotations

import dataclasses
import io
import json
import threading

import numpy as np
import onnx
import pytest

from onnxaccel import providers, startup
from onnxaccel.engines import prewarm
from onnxaccel.target import parse_target


@pytest.fixture(autouse=True)
def clean():
    prewarm.wait(30)
    prewarm._started.clear()
    startup.reset()
    yield
    prewarm.wait(30)
    prewarm._started.clear()
    startup.reset()


@pytest.fixture
def cpu_with_prewarm():
    """The CPU spec with a warm-up, for the test only (the real one has none)."""
    original = providers.get("cpu")
    providers.register(dataclasses.replace(original, prewarm=providers.Prewarm()))
    yield
    providers.register(original)


def warm_spans():
    return [s for s in startup.spans() if s.stage == "provider warm-up"]


def test_the_tiny_model_passes_the_full_checker_and_computes_on_a_real_session():
    import onnxruntime as ort

    model = prewarm.tiny_model()
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    conv, mm = session.run(None, {"x": np.ones((1, 8, 16, 16), np.float16), "m": np.ones((16, 16), np.float16)})
    assert conv[0, 0, 5, 5] == pytest.approx(8 * 9 * 0.01, rel=1e-2)  # interior: 8 channels x 3x3 x 0.01
    assert conv[0, 0, 0, 0] == pytest.approx(8 * 4 * 0.01, rel=1e-2)  # corner: 2x2 of the kernel in the image
    assert (mm == 16).all()


def test_only_providers_with_a_prewarm_and_never_when_turned_off(monkeypatch):
    assert providers.get("cpu").prewarm is None and prewarm.start(parse_target("cpu")) is None
    assert providers.get("cuda").prewarm is not None
    assert prewarm.start(None) is None
    monkeypatch.setenv(prewarm.ENV, "0")
    assert prewarm.start(parse_target("cuda:0")) is None
    assert warm_spans() == []


def test_the_tiny_session_takes_only_the_options_its_spec_names():
    """Graph capture and a user's options stay with the real session; the device and layout come along."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("a CUDA build here would run the warm-up for real")
    seen = {}
    original = prewarm._warm
    try:
        prewarm._warm = lambda provider, options: seen.update(provider=provider, options=options)
        thread = prewarm.start(parse_target("cuda:1/fp16?enable_cuda_graph=1&prefer_nhwc=1&gpu_mem_limit=1024"))
        thread.join(10)
    finally:
        prewarm._warm = original
    assert seen == {"provider": "CUDAExecutionProvider",
                    "options": {"device_id": "1", "prefer_nhwc": "1", "cudnn_conv_algo_search": "HEURISTIC"}}


def test_a_provider_missing_from_the_build_is_skipped_with_the_reason_not_failed():
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    prewarm.start(parse_target("cuda:0")).join(60)
    (span,) = warm_spans()
    assert span.detail == "skipped: CUDAExecutionProvider is not in this onnxruntime build"


def test_once_per_provider_and_options_per_process(cpu_with_prewarm):
    first = prewarm.start(parse_target("cpu"))
    assert prewarm.start(parse_target("cpu")) is first
    first.join(60)
    (span,) = warm_spans()
    assert span.detail == "CPUExecutionProvider, a tiny session in the background" and span.seconds > 0


def test_what_the_warm_up_thread_prints_is_dropped_and_every_other_thread_still_prints(monkeypatch):
    real = io.StringIO()
    monkeypatch.setattr("sys.stdout", real)
    printed = threading.Event()

    def other():
        print("from the main work")
        printed.set()

    def warm():
        with prewarm._quiet():
            print("Failed to load libcudnn (the provider's own print)")
            worker = threading.Thread(target=other)
            worker.start()
            worker.join()
        print("after the warm-up")

    thread = threading.Thread(target=warm)
    thread.start()
    thread.join()
    assert printed.is_set()
    assert real.getvalue() == "from the main work\nafter the warm-up\n"


@pytest.mark.parametrize("command", ["run", "bench", "batch"])
def test_commands_start_the_warm_up_and_keep_their_json_clean(command, cpu_with_prewarm, mlp_path, tmp_path):
    from typer.testing import CliRunner

    from onnxaccel.cli.main import app

    args = {"run": ["run", str(mlp_path)],
            "bench": ["bench", str(mlp_path), "--runs", "3", "--warmup", "1"],
            "batch": ["batch", str(mlp_path), "--input", str(tmp_path / "rows.npy"), "--output",
                      str(tmp_path / "out")]}[command]
    np.save(tmp_path / "rows.npy", np.ones((6, 4), np.float32))
    done = CliRunner().invoke(app, [*args, "--target", "cpu", "--json"])
    assert done.exit_code == 0, done.output
    json.loads(done.stdout)  # nothing printed into the report
    prewarm.wait(60)
    (span,) = warm_spans()
    assert span.detail == "CPUExecutionProvider, a tiny session in the background"


def test_a_process_that_ends_first_waits_for_the_warm_up_at_exit(tmp_path):
    """A daemon thread inside a native library while the interpreter finalizes can crash the exit: the process
    waits for it (at most EXIT_WAIT_S)."""
    import subprocess
    import sys

    done = tmp_path / "done"
    code = f"""
import dataclasses, time
from onnxaccel import providers
from onnxaccel.engines import prewarm
from onnxaccel.target import parse_target
providers.register(dataclasses.replace(providers.get("cpu"), prewarm=providers.Prewarm()))
def slow(provider, options):
    time.sleep(0.5)
    open({str(done)!r}, "w").write(provider)
prewarm._warm = slow
prewarm.start(parse_target("cpu"))
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert done.read_text() == "CPUExecutionProvider"
