"""`onnxaccel loadtest` against the real server: HTTP binary (the default), HTTP JSON and gRPC; the JSON report's schema; the
loadtest counts refused requests as errors rather than failing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

LOADTEST = ("import typer\nfrom onnxaccel.cli import loadtest\napp = typer.Typer()\n"
            "app.callback()(lambda: None)\nloadtest.register(app)\napp()")


def run_loadtest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOADTEST, "loadtest", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "100"})


def test_loadtest_http_json_report(server, tmp_path):
    report = tmp_path / "report.json"
    done = run_loadtest(server.url, "--model", "mlp", "-c", "1,4", "--duration", "1", "--warmup", "0.2",
                        "--report", str(report), "--no-binary")
    assert done.returncode == 0, done.stderr
    assert "p99" in done.stdout and "req/s" in done.stdout
    data = json.loads(report.read_text())
    assert data["config"]["binary"] is False
    assert data["schema"] == "onnxaccel.loadtest/1" and data["server"]["name"] == "onnxaccel"
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 4]
    for level in data["levels"]:
        assert level["requests"] > 0 and level["error_count"] == 0 and level["requests_per_s"] > 0
        assert level["latency"]["p50_ms"] <= level["latency"]["p99_ms"]
        assert level["server_compute_ms"] is not None


def test_loadtest_binary_and_grpc_json_output(server):
    for extra in ([], ["--protocol", "grpc", "--grpc-url", server.grpc_url]):  # HTTP: binary by default
        done = run_loadtest(server.url, "--model", "cls", "-c", "2", "--duration", "1", "--warmup", "0.2",
                            "--batch", "2", "--shape", "x=2x3x48x192", "--json", *extra)
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        level = data["levels"][0]
        assert level["requests"] > 0 and level["error_count"] == 0
        assert level["inferences_per_s"] == level["requests_per_s"] * 2
        assert data["input_shapes"] == {"x": [2, 3, 48, 192]}
        if not extra:  # the default measures the model, not JSON encoding (JSON encoding dominated the GPU figures)
            assert data["config"]["binary"] is True


def test_loadtest_counts_refusals_as_errors(server):
    done = run_loadtest(server.url, "--model", "mlp", "-c", "2", "--duration", "0.5", "--warmup", "0",
                        "--batch", "17", "--json")  # above mlp's max_batch 16: every request is a 400
    assert done.returncode == 0, done.stderr
    level = json.loads(done.stdout)["levels"][0]
    assert level["requests"] == 0 and set(level["errors"]) == {"400"} and level["latency"] is None


def test_loadtest_unknown_model_is_a_clear_error(server):
    done = run_loadtest(server.url, "--model", "nope", "--duration", "0.2")
    assert done.returncode != 0 and "no ready model 'nope'" in done.stderr


def test_serve_config_is_read_by_the_tune_config_reader(tmp_path, mlp_path):
    """`serve --config` takes the file `onnxaccel tune` writes, validated like `run/bench --config`."""
    import subprocess
    import sys

    bad = tmp_path / "tuned.json"
    bad.write_text('{"target": "cuda:0/fp16"}')  # no schema: not a tune configuration
    proc = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", "serve", str(mlp_path), "--config", str(bad),
                           "--http-port", "0", "--no-grpc"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "hint:" in proc.stderr and "Traceback" not in proc.stderr
    missing = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", "serve", str(mlp_path), "--config",
                              str(tmp_path / "none.json")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "Configuration file not found" in " ".join(missing.stderr.split())
