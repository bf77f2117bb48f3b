"""Every malformed request gets the protocol's status (400, or 404/413/503 where those apply) and a message
that names what is wrong; raw requests sent with httpx, so nothing on the client side fixes them first."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest

X = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1, 0.2, 0.3, 0.4]}


def infer(server, model: str, body: bytes | dict, headers: dict | None = None, version: str | None = None):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    content = json.dumps(body).encode() if isinstance(body, dict) else body
    return httpx.post(server.url + path, content=content, headers=headers or {}, timeout=30)


def binary_body(header: dict, blob: bytes) -> tuple[bytes, dict]:
    head = json.dumps(header).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head)),
                         "Content-Type": "application/octet-stream"}


CASES = {
    "unknown model": ("nope", {"inputs": [X]}, 404, "Unknown model 'nope'"),
    "unknown input": ("mlp", {"inputs": [{**X, "name": "y"}]}, 400, "has no input named 'y'"),
    "missing input": ("mlp", {"inputs": [{**X, "name": "y"}, X][1:], "outputs": [{"name": "nope"}]}, 400,
                      "no output named 'nope'"),
    "wrong rank": ("mlp", {"inputs": [{**X, "shape": [4]}]}, 400, "rank 2"),
    "wrong axis": ("mlp", {"inputs": [{**X, "shape": [1, 5], "data": [0] * 5}]}, 400,
                   "must have 4 on axis 1"),
    "wrong dtype": ("mlp", {"inputs": [{**X, "datatype": "INT64", "data": [1, 2, 3, 4]}]}, 400,
                    "is FP32; the request sends INT64"),
    "unknown datatype": ("mlp", {"inputs": [{**X, "datatype": "FLOAT"}]}, 400, "datatype 'FLOAT'"),
    "element count": ("mlp", {"inputs": [{**X, "data": [1, 2, 3]}]}, 400, "(4 elements), but 'data' holds 3"),
    "strings as FP32": ("mlp", {"inputs": [{**X, "data": ["a", "b", "c", "d"]}]}, 400, "must be numbers"),
    "ragged data": ("mlp", {"inputs": [{**X, "shape": [2, 2], "data": [[1, 2], [3]]}]}, 400, "ragged"),
    "negative dim": ("mlp", {"inputs": [{**X, "shape": [-1, 4]}]}, 400, "non-negative integers"),
    "no inputs": ("mlp", {"inputs": []}, 400, "non-empty 'inputs'"),
    "not json": ("mlp", b"{not json", 400, "not valid JSON"),
    "batch above max": ("mlp", {"inputs": [{**X, "shape": [17, 4], "data": [0.0] * 68}]}, 400,
                        "above the model's max_batch 16"),
    "wrong version": ("mlp", {"inputs": [X]}, 404, "no version '7'"),
    "model failed to load": ("broken", {"inputs": [X]}, 503, "not an ONNX model"),
    # The session server offers system shared memory (--shared-memory system; off by default): a region without its
    # byte size is refused naming what is missing (tests/serve/test_shared_memory.py covers the extension).
    "shared memory": ("mlp", {"inputs": [{**X, "parameters": {"shared_memory_region": "r"}}]}, 400,
                      "names shared memory region 'r' and also has data"),
    "shared memory size": ("mlp", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                               "parameters": {"shared_memory_region": "r"}}]}, 400,
                           "without shared_memory_byte_size"),
    "bad base64": ("echo", {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["@@@"],
                                        "parameters": {"content_type": "base64"}}]}, 400, "not valid base64"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_json_request_errors(server, case):
    model, body, status, message = CASES[case]
    response = infer(server, model, body, version="7" if case == "wrong version" else None)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]


def test_binary_size_larger_than_body(server):
    body, headers = binary_body({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                             "parameters": {"binary_data_size": 32}}]}, b"\0" * 16)
    response = infer(server, "mlp", body, headers)
    assert response.status_code == 400
    assert "binary_data_size 32 at offset 0, but the binary part of the body has only 16 bytes" in \
        response.json()["error"]


def test_binary_size_not_matching_shape(server):
    body, headers = binary_body({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                             "parameters": {"binary_data_size": 12}}]}, b"\0" * 12)
    response = infer(server, "mlp", body, headers)
    assert response.status_code == 400
    assert "FP32 of shape [1, 4]: 16 bytes expected, 12 given" in response.json()["error"]


def test_binary_trailing_bytes(server):
    body, headers = binary_body({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                             "parameters": {"binary_data_size": 16}}]}, b"\0" * 20)
    response = infer(server, "mlp", body, headers)
    assert response.status_code == 400 and "20 bytes of binary tensor data" in response.json()["error"]


def test_header_length_past_body(server):
    response = infer(server, "mlp", b"{}", {"Inference-Header-Content-Length": "999"})
    assert response.status_code == 400 and "the body has 2 bytes" in response.json()["error"]


def test_oversized_request_gets_413_before_the_body_is_read(server):
    big = b"x" * (5 * 1024 * 1024)  # the session server accepts 4 MiB
    response = infer(server, "mlp", big)
    assert response.status_code == 413
    assert "this server accepts at most 4194304" in response.json()["error"]


def test_oversized_chunked_request_gets_413(server):
    def chunks():
        for _ in range(80):
            yield b"y" * 65536  # 5 MiB without a Content-Length

    response = httpx.post(server.url + "/v2/models/mlp/infer", content=chunks(), timeout=30)
    assert response.status_code == 413


def test_bytes_tensors_round_trip_as_text_and_base64(server):
    doc = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["héllo", "wörld"]}]}
    response = infer(server, "echo", doc)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == ["héllo", "wörld"]
    encoded = [base64.b64encode("ab".encode()).decode()]
    doc = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": encoded,
                       "parameters": {"content_type": "base64"}}]}
    assert infer(server, "echo", doc).json()["outputs"][0]["data"] == ["ab"]


def test_server_still_serves_after_every_bad_request(server):
    response = infer(server, "mlp", {"inputs": [X]})
    assert response.status_code == 200
    probs = np.asarray(response.json()["outputs"][0]["data"])
    assert probs.shape == (3,) and abs(probs.sum() - 1) < 1e-5
