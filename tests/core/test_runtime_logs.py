"""ONNX Runtime's own log lines ([W:onnxruntime:...], [E:onnxruntime:...]) stay out of the user's output
unless --verbose or --debug, and never corrupt --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxaccel import load_model
from onnxaccel.engines.ort import OrtEngine, runtime_log_severity, set_runtime_log_level
from onnxaccel.errors import InferenceError
from onnxaccel.target import parse_target

ONNXACCEL = Path(sys.executable).parent / "onnxaccel"  # the installed console script, as users run it
ORT_LOG_LINE = "onnxruntime:"  # every ONNX Runtime log line carries "[W:onnxruntime:" / "[E:onnxruntime:"


def _save(tmp_path: Path, name: str, node, inputs, output, initializers) -> Path:
    graph = helper.make_graph([node], name, inputs, [output], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def unused_initializer(tmp_path_factory) -> Path:
    """Session creation logs "[W:onnxruntime:, graph.cc ... CleanUnusedInitializersAndNodeArgs] Removing
    initializer 'unused'" (onnxruntime 1.32)."""
    return _save(tmp_path_factory.mktemp("logs"), "unused", helper.make_node("Relu", ["x"], ["y"]),
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                 helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
                 [numpy_helper.from_array(np.ones(3, np.float32), "unused")])


@pytest.fixture(scope="module")
def gather_out_of_bounds(tmp_path_factory) -> tuple[Path, Path]:
    """A run fails and logs "[E:onnxruntime:, sequential_executor.cc ... ExecuteKernel] ... indices element
    out of data bounds" (onnxruntime 1.32)."""
    tmp = tmp_path_factory.mktemp("logs")
    model = _save(tmp, "gather", helper.make_node("Gather", ["data", "i"], ["y"]),
                  [helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
                  helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
                  [numpy_helper.from_array(np.ones((3, 4), np.float32), "data")])
    indices = tmp / "i.npy"
    np.save(indices, np.array([0, 100], np.int64))
    return model, indices


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ONNXACCEL), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})


def test_session_warnings_are_hidden_and_verbose_shows_them(unused_initializer):
    proc = cli("run", str(unused_initializer), "-t", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    assert ORT_LOG_LINE not in proc.stderr
    assert json.loads(proc.stdout)["schema"] == "onnxaccel.run/1"
    proc = cli("--verbose", "run", str(unused_initializer), "-t", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "[W:onnxruntime:" in proc.stderr and "CleanUnusedInitializersAndNodeArgs" in proc.stderr
    json.loads(proc.stdout)


def test_a_failing_run_logs_no_runtime_error_line(gather_out_of_bounds):
    model, indices = gather_out_of_bounds
    for extra in (["--json"], []):
        proc = cli("run", str(model), "-t", "cpu", "--input", f"i={indices}", *extra)
        assert proc.returncode == 1
        assert ORT_LOG_LINE not in proc.stderr and "\x1b[1;31m" not in proc.stderr
        if extra:
            assert json.loads(proc.stdout)["error"] == "InferenceError"
        else:
            assert "out of data bounds" in proc.stderr  # our own error says it, once


def test_verbose_shows_the_runtime_error_line_beside_our_error(gather_out_of_bounds):
    model, indices = gather_out_of_bounds
    proc = cli("--verbose", "run", str(model), "-t", "cpu", "--input", f"i={indices}", "--json")
    assert proc.returncode == 1
    assert "[E:onnxruntime:" in proc.stderr
    assert json.loads(proc.stdout)["error"] == "InferenceError"


def test_the_library_is_quiet_by_default(gather_out_of_bounds, capfd):
    model, _ = gather_out_of_bounds
    assert runtime_log_severity() == 4  # fatal only, until the CLI's --verbose/--debug says otherwise
    runner = OrtEngine().compile(load_model(model), parse_target("cpu"))
    with pytest.raises(InferenceError, match="out of data bounds"):
        runner.run({"i": np.array([0, 100], np.int64)})
    assert ORT_LOG_LINE not in capfd.readouterr().err


def test_unknown_log_level_is_refused():
    with pytest.raises(ValueError, match="quiet, verbose, debug"):
        set_runtime_log_level("loud")


def test_optimize_graph_levels_follow_the_runtime_log_level(unused_initializer, capfd):
    """transform.graph.ort_optimize's session logs like every session: quiet by default, warnings with
    --verbose (it used to log at a fixed severity 3, so --verbose showed nothing)."""
    from onnxaccel.transform.graph import ort_optimize

    proto = onnx.load(str(unused_initializer))
    try:
        ort_optimize(proto, "basic", "CPUExecutionProvider")
        assert ORT_LOG_LINE not in capfd.readouterr().err
        set_runtime_log_level("verbose")
        optimized = ort_optimize(proto, "basic", "CPUExecutionProvider")
        assert "Removing initializer" in capfd.readouterr().err
    finally:
        set_runtime_log_level("quiet")
    assert not optimized.graph.initializer
