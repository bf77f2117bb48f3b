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
