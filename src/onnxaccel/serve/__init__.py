"""Serving over the Open Inference Protocol (KServe v2): HTTP and gRPC, dynamic batching, a model repository,
Prometheus metrics, back-pressure, graceful drain. The load test client is :mod:`onnxaccel.loadtest`.

Public API (fastapi, uvicorn, grpcio and prometheus-client come with the ``serve`` extra and are imported only
when a server is built)::

    from onnxaccel.serve import ServerConfig, serve
    serve("models/", {"target": "cuda:0", "max_batch": 32}, ServerConfig(http_port=8000))
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ServerConfig": "onnxaccel.serve.config", "ModelConfig": "onnxaccel.serve.config",
    "serve": "onnxaccel.serve.launch", "InferenceServer": "onnxaccel.serve.server",
    "ServeResult": "onnxaccel.serve.server",
    "ProtocolError": "onnxaccel.serve.protocol",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'onnxaccel.serve' has no attribute {name!r}")
