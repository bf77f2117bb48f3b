"""``serve``: one server process, or a supervisor with worker processes and a shared model process.

Its own module because it chooses between :mod:`onnxaccel.serve.server` and :mod:`onnxaccel.serve.workers`,
and workers imports server: the choice above both keeps the imports one way.
"""

from __future__ import annotations

from collections.abc import Callable

from onnxaccel.serve.config import ModelConfig, ServerConfig, model_defaults as as_defaults
from onnxaccel.serve.processes import log_level
from onnxaccel.serve.server import InferenceServer, ServeResult, run_server
from onnxaccel.serve.workers import serve_workers


def serve(source: str, model_defaults: ModelConfig | dict, config: ServerConfig,
          on_ready: Callable[[InferenceServer], None] | None = None) -> ServeResult:
    """Serve until SIGTERM/SIGINT; blocking. Uses uvloop when installed (uvicorn's "auto" choice does too).
    With ``config.workers`` > 1, a supervisor runs that many server processes (serve/workers.py).
    ``model_defaults``: what every model gets (serve/config.py model_defaults), typed once here."""
    model_defaults = as_defaults(model_defaults)
    log_level(config.log_level)
    if config.workers > 1 or config.shared_models:
        return serve_workers(source, model_defaults, config, on_ready)
    return run_server(InferenceServer(source, model_defaults, config, on_ready))
