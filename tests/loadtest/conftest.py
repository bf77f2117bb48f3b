"""The load test runs against a real `onnxaccel serve` on loopback: the serve tests' server and repository."""

from tests.serve.conftest import model_repo, server  # noqa: F401 - fixtures, registered by import
