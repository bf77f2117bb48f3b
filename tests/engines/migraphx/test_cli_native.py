"""`run`, `compare`, `bench` and `serve` take the native engine (`--target migraphx@migraphx`) as a real
process, and say how to install MIGraphX when it is missing.

NOT EXECUTED ON AMD HARDWARE: the subprocesses import the stand-in module (tests/engines/migraphx/fake_migraphx,
put first on PYTHONPATH), which computes on the CPU with ONNX Runtime.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from native_helpers import subprocess_env


def cli(tmp_path, *args, fake=True, timeout=300):
    return subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", *args], capture_output=True, text=True,
                          env=subprocess_env(tmp_path, fake=fake), timeout=timeout)


def test_run_on_the_native_engine(tmp_path, mlp_file):
    proc = cli(tmp_path, "run", str(mlp_file), "--target", "migraphx@migraphx", "--batch", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["providers"] == ["MIGraphX"] and data["target"] == "migraphx@migraphx"
    assert data["placement"]["summary"] == "MIGraphX took 4/4 nodes"


def test_second_process_loads_the_compiled_program(tmp_path, mlp_file):
    log = tmp_path / "calls.jsonl"
    env_log = {"FAKE_MIGRAPHX_LOG": str(log)}
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", "run", str(mlp_file), "-t",
                               "migraphx/fp16@migraphx"],
                              capture_output=True, text=True, env={**subprocess_env(tmp_path), **env_log}, timeout=300)
        assert proc.returncode == 0, proc.stderr
    names = [json.loads(line)[0] for line in log.read_text().splitlines()]
    assert names.count("compile") == 1 and names.count("load") == 1 and names.count("quantize_fp16") == 1


def test_compare_native_engine_against_cpu(tmp_path, mlp_file):
    proc = cli(tmp_path, "compare", str(mlp_file), "--target", "cpu", "--target", "migraphx@migraphx", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["passed"] is True


def test_bench_native_engine(tmp_path, mlp_file):
    proc = cli(tmp_path, "bench", str(mlp_file), "--target", "migraphx@migraphx", "--runs", "5", "--warmup", "1",
               "--json")
    assert proc.returncode == 0, proc.stderr
    assert "migraphx@migraphx" in proc.stdout


def test_serve_native_engine_answers_health_and_inference(tmp_path, mlp_file):
    server = subprocess.Popen([sys.executable, "-m", "onnxaccel.cli.main", "serve", str(mlp_file), "--target",
                               "migraphx@migraphx", "--http-port", "0", "--no-grpc", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(tmp_path))
    try:
        ready = json.loads(server.stdout.readline())
        assert ready["event"] == "ready" and ready["models"][0]["state"] == "READY", ready
        url = ready["http_url"]
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=10) as response:
            assert response.status == 200
        x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
        body = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.reshape(-1).tolist()}]}
        request = urllib.request.Request(f"{url}/v2/models/mlp/infer", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            out = json.loads(response.read())["outputs"][0]
        assert out["shape"] == [2, 3] and np.allclose(np.sum(np.reshape(out["data"], (2, 3)), axis=1), 1, atol=1e-5)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.parametrize("command", ["run", "bench"])
def test_without_migraphx_the_cli_says_how_to_get_it(tmp_path, mlp_file, command):
    start = time.perf_counter()
    proc = cli(tmp_path, command, str(mlp_file), "--target", "migraphx@migraphx", fake=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    text = " ".join(proc.stderr.split())
    assert "needs AMD's 'migraphx' Python module" in text and "apt install migraphx" in text
    assert time.perf_counter() - start < 120
