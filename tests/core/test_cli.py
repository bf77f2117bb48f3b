"""The `onnxaccel` command as users run it: a real process, real exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from onnxaccel import __version__


def cli(*args: str, check: bool | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_version():
    assert cli("--version", check=True).stdout.strip() == f"onnxaccel {__version__}"


def test_run_pretrained_classifier_prints_topk(pretrained_cls):
    out = cli("run", str(pretrained_cls), "--target", "cpu", "--shape", "x=2x3x48x192", "--topk", "2",
              check=True).stdout
    assert "CPUExecutionProvider" in out and "CPU took" in out
    assert "top-2 save_infer_model/scale_0.tmp_1[1]:" in out


def test_run_json_is_machine_readable_and_save_writes_outputs(tmp_path, pretrained_cls):
    save = tmp_path / "out.npz"
    proc = cli("run", str(pretrained_cls), "-t", "cpu", "-s", "x=1x3x48x192", "--no-iobinding", "--save",
               str(save), "--json", check=True)
    data = json.loads(proc.stdout)
    assert data["schema"] == "onnxaccel.run/1" and data["providers"] == ["CPUExecutionProvider"]
    assert data["placement"]["method"] == "assignment-info" and data["iobinding"] is False
    with np.load(save) as saved:
        assert saved[data["outputs"][0]["name"]].shape == (1, 2)


def test_run_with_an_image_input(tmp_path, pretrained_cls):
    from PIL import Image

    Image.new("RGB", (400, 100), (255, 255, 255)).save(tmp_path / "text.jpg")
    data = json.loads(cli("run", str(pretrained_cls), "-t", "cpu", "-s", "x=1x3x48x192", "--input",
                          f"x={tmp_path / 'text.jpg'}", "--json", check=True).stdout)
    assert data["input_shapes"] == {"x": [1, 3, 48, 192]}


def test_auto_target_picks_a_target_that_loads(mlp_path):
    data = json.loads(cli("run", str(mlp_path), "--json", check=True).stdout)
    assert data["target"] == "cpu"  # the only target that loads on a machine without GPUs


@pytest.mark.parametrize("args,code,message", [
    (["run", "no/such/model.onnx"], 1, "Model file not found"),
    (["run", "MLP", "--target", "gpu"], 2, "Unknown target device 'gpu'"),
    (["run", "MLP", "--target", "cuda"], 1, "CUDAExecutionProvider is not part of the installed"),
    (["run", "MLP", "--target", "rocm"], 2, "removed from ONNX Runtime in 1.23"),
    (["run", "MLP", "-t", "cuda", "--ep-option", "prefer_nchw=1"], 2, "Did you mean 'prefer_nhwc'"),
    (["run", "MLP", "--shape", "x=1x5"], 2, "axis 1 is fixed to 4"),
    (["run", "MLP", "--input", "y=/no/file.npy"], 2, "Input file not found"),
    (["run", "zoo:resnet-fifty"], 1, "zoo"),
])
def test_bad_input_gets_a_message_a_hint_and_no_traceback(mlp_path, args, code, message):
    proc = cli(*[str(mlp_path) if a == "MLP" else a for a in args])
    assert proc.returncode == code, proc.stderr
    assert message in " ".join(proc.stderr.split())
    assert "hint:" in proc.stderr and "Traceback" not in proc.stderr


def test_debug_shows_the_traceback():
    proc = cli("--debug", "run", "no/such/model.onnx")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_json_errors_are_json(mlp_path):
    proc = cli("run", str(mlp_path), "--target", "cuda", "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["error"] == "ProviderUnavailableError"


def test_usage_errors_exit_2():
    assert cli("run").returncode == 2
    assert cli("no-such-command").returncode == 2


def test_bench_reports_latency_percentiles_and_throughput(mlp_path):
    report = json.loads(cli("bench", str(mlp_path), "-t", "cpu", "--batch", "4", "--warmup", "2", "--runs", "20",
                            "--json", check=True).stdout)
    assert report["schema"] == "onnxaccel.bench/2" and len(report["cells"]) == 1
    data = report["cells"][0]
    lat = data["latency"]
    assert data["batch"] == 4 and lat["count"] == 20
    assert lat["min_ms"] <= lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    assert data["throughput_items_per_s"] == pytest.approx(4 / (lat["p50_ms"] / 1e3))
