"""Serving over the Open Inference Protocol (KServe v2): HTTP and gRPC, dynamic batching, a model repository,
Prometheus metrics, back-pressure, graceful drain; and a perf_analyzer-style load test client.

Public API (fastapi, uvicorn, grpcio and prometheus-client come with the ``serve`` extra and are imported only
when a server is built)::

    from onnxaccel.serve import ServerConfig, serve, LoadtestConfig, run_loadtest
    serve("models/", {"target": "cuda:0", "max_batch": 32}, ServerConfig(http_port=8000))
    report = run_loadtest(LoadtestConfig(url="http://127.0.0.1:8000", model="resnet50", binary=True))
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ServerConfig": "onnxaccel.serve.config", "ModelConfig": "onnxaccel.serve.config",
    "serve": "onnxaccel.serve.server", "InferenceServer": "onnxaccel.serve.server",
    "ServeResult": "onnxaccel.serve.server",
    "LoadtestConfig": "onnxaccel.serve.loadtest", "LoadtestReport": "onnxaccel.serve.loadtest",
    "LevelResult": "onnxaccel.serve.loadtest", "run_loadtest": "onnxaccel.serve.loadtest",
    "ProtocolError": "onnxaccel.serve.protocol",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'onnxaccel.serve' has no attribute {name!r}")
