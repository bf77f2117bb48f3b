"""Property-based requests generated from the server's own OpenAPI document (schemathesis), bounded.

Checks: no 5xx, every status and content type is one the document declares, bodies match the declared
schemas, and schema-invalid requests are rejected with 4xx. Not checked: ``positive_data_acceptance``
(a schema-valid request must succeed), because the schema cannot encode that a model name must be one of the
loaded models or that a tensor's data must fit its shape; those requests rightly get 400/404.
(schemathesis' own pytest plugin fails on pytest 9 with "'Function' object has no attribute '_nodeid'", so the
operations are driven through its Python API.)
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402 - after the importorskip

MAX_EXAMPLES = 15


def test_every_operation_conforms_to_the_openapi_document(server):
    from schemathesis.checks import CHECKS

    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    schema.config.update(base_url=server.url)
    excluded = [c for c in CHECKS.get_all() if c.__name__ == "positive_data_acceptance"]
    operations, calls, failures = 0, [], []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith(("/load", "/unload")):
            continue  # would unload the models the other tests use; covered by test_repository.py
        operations += 1

        @given(case=operation.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                  derandomize=True, database=None)
        def check(case):
            response = case.call_and_validate(excluded_checks=excluded, timeout=30)
            calls.append(response.status_code)

        try:
            check()
        except Exception as exc:  # noqa: BLE001 - collect every operation's failure, then report them all
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}")
    assert operations >= 10 and len(calls) >= operations * 3
    assert any(400 <= code < 500 for code in calls)  # invalid requests were generated and refused
    assert not failures, "\n\n".join(failures)
    assert server.proc.poll() is None  # still running


#: Hostile or broken requests found by hand (issue 21) that the generated ones do not reach: each must get a
#: 4xx with an {"error": ...} message, never a 5xx. (path suffix, body, extra headers)
CORPUS = [
    ("mlp/infer", b"[" * 100_000, {}),  # was 500 (RecursionError)
    ("mlp/infer", b'{"inputs": [{"name": "x", "shape": [4611686018427387904, 0, 224, 224], "datatype": "FP32", '
                  b'"data": []}]}', {}),  # was 500 (numpy: array is too big)
    ("mlp/infer", b'{"inputs": [{"name": "x", "shape": [9223372036854775807, 9223372036854775807], '
                  b'"datatype": "FP32", "data": []}]}', {}),
    ("mlp/infer", b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": ' + b"[" * 5000
                  + b"1" + b"]" * 5000 + b"}]}", {}),
    ("mlp/infer", b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", '
                  b'"parameters": {"binary_data_size": 16}}]}', {"Inference-Header-Content-Length": "99999"}),
    ("mlp/infer", b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", '
                  b'"parameters": {"binary_data_size": 16}}]}', {"Inference-Header-Content-Length": "-5"}),
    ("mlp/infer", b"\x1f\x8b\x08\x00garbage", {"Content-Encoding": "gzip"}),
    ("mlp/infer", b"{}", {"Content-Encoding": "br"}),
    ("mlp/infer", b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}], '
                  b'"outputs": [{"name": "nope"}]}', {}),
    ("echo/infer", b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["%%"], '
                   b'"parameters": {"content_type": "base64"}}]}', {}),
    ("nosuch/infer", b"{}", {}),
]


def test_a_hostile_corpus_gets_4xx_never_5xx(server):
    import httpx

    for suffix, body, headers in CORPUS:
        response = httpx.post(f"{server.url}/v2/models/{suffix}", content=body, headers=headers, timeout=30)
        assert 400 <= response.status_code < 500, (suffix, body[:80], response.status_code, response.text[:300])
        assert response.json()["error"], body[:80]
    deep = httpx.post(f"{server.url}/v2/repository/index", content=b"[" * 50_000)
    assert deep.status_code == 400
    assert server.proc.poll() is None
