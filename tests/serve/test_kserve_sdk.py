"""The KServe SDK's own clients (InferenceRESTClient, JSON and binary; InferenceGRPCClient) against the server.

The kserve package pulls in kubernetes, pandas, cryptography and a different protobuf (6.x) than the rest of
the test environment, so it lives in its own interpreter: ONNXACCEL_KSERVE_PYTHON if set, else a throwaway
venv with kserve==0.21.0 from PyPI (built once, cached under .pytest_cache/venvs; a slow test).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest


def kserve_python() -> str:
    if importlib.util.find_spec("kserve") is not None:
        return sys.executable
    if os.environ.get("ONNXACCEL_KSERVE_PYTHON"):
        return os.environ["ONNXACCEL_KSERVE_PYTHON"]
    from venvs import throwaway_venv

    return str(throwaway_venv(["kserve==0.21.0"], with_project=False))


@pytest.mark.slow
def test_kserve_sdk_rest_and_grpc_clients(server, model_repo):
    python = kserve_python()
    done = subprocess.run([python, str(Path(__file__).with_name("kserve_client.py")), server.url, server.grpc_url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    sess = ort.InferenceSession(str(model_repo / "mlp" / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = sess.run(None, {"x": np.arange(8, dtype=np.float32).reshape(2, 4) / 8})[0]
    assert got["ready"] is True
    for key in ("rest_json", "rest_binary", "grpc"):
        np.testing.assert_array_equal(np.asarray(got[key], np.float32), expected, err_msg=key)
