"""`loadtest` counts the rows its requests carry as inferences: with the default --batch 1, --shape x=4x4 on mlp's
free batch axis sends 4 rows per request, and the report says 4 rows per request and 4x the requests/s as
inferences/s, as the server's own statistics count them (inference_count: rows). Against the real server on
loopback (tests/serve/conftest.py)."""

from __future__ import annotations

import json
import urllib.request

from tests.loadtest.test_loadtest import run_loadtest


def _rows_served(server) -> int:
    with urllib.request.urlopen(f"{server.url}/v2/models/mlp/stats", timeout=10) as answer:
        return json.loads(answer.read())["model_stats"][0]["inference_count"]


def test_rows_given_by_shape_are_counted_as_inferences(server):
    before = _rows_served(server)
    done = run_loadtest(server.url, "--model", "mlp", "-c", "2", "--duration", "5", "--warmup", "0",
                        "--workers", "1", "--max-requests", "24", "--shape", "x=4x4", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    level = data["levels"][0]
    assert data["config"]["batch"] == 1 and data["input_shapes"] == {"x": [4, 4]}
    assert level["requests"] == 24 and level["error_count"] == 0
    assert _rows_served(server) - before == 24 * 4  # the server ran 4 rows per request
    assert level["inferences_per_s"] == level["requests_per_s"] * 4
    assert level["rows_per_request"] == 4


def test_rows_per_request_follow_the_variable_batch_axis():
    from onnxaccel.loadtest.shapes import request_rows

    metadata = {"inputs": [{"name": "audio", "datatype": "FP32", "shape": [-1, 512]},
                           {"name": "state", "datatype": "FP32", "shape": [2, -1, 128]}]}
    inputs = {"audio": [[0.0] * 512] * 3, "state": [[[0.0] * 128] * 3] * 2}
    assert request_rows(metadata, inputs, 1) == 3  # not the state's fixed axis 0 of 2
    fixed = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4]}]}
    assert request_rows(fixed, {"x": [[0.0] * 4] * 2}, 1) == 1  # no variable axis 0: --batch, as before
