"""Zoo tests build real models; they go into one cache for the whole session."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def zoo_session_cache(tmp_path_factory):
    """Point ONNXACCEL_CACHE_DIR at a session temp dir, unless the caller already chose one.

    A top-level conftest (or the user) may set a persistent cache so models are built once across runs;
    that choice is kept.
    """
    if os.environ.get("ONNXACCEL_CACHE_DIR"):
        yield os.environ["ONNXACCEL_CACHE_DIR"]
        return
    with pytest.MonkeyPatch.context() as patch:
        cache = tmp_path_factory.mktemp("onnxaccel-cache")
        patch.setenv("ONNXACCEL_CACHE_DIR", str(cache))
        yield str(cache)
