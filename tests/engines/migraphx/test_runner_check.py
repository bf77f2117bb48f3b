"""The native MIGraphX runner gets its feed check from the Runner template (engines/base.py): once per run and
once per bind, never again inside the engine; with fixed axes and lossless casts, as it compiles a program per
shape and casts what it is given.

NOT EXECUTED ON AMD HARDWARE: `migraphx` here is the stand-in (tests/engines/migraphx/fake_migraphx).
"""

from __future__ import annotations

import numpy as np
import pytest

from native_helpers import native
from onnxaccel.engines import compile_model
from onnxaccel.errors import InputError
from onnxaccel.feeds_check import FeedCheck


def test_the_migraphx_runner_checks_once_per_run_and_once_per_bind(fake_mgx, mlp, monkeypatch):
    runner = compile_model(mlp, native())
    calls = []
    real = FeedCheck.__call__
    monkeypatch.setattr(FeedCheck, "__call__", lambda self, feeds: (calls.append(1), real(self, feeds))[1])
    for name in ("validate_feeds", "check_tensor"):
        monkeypatch.setattr(f"onnxaccel.feeds_check.{name}", lambda *a, **k: pytest.fail(f"{name} called"))
    x = {"x": np.ones((2, 4), np.float32)}
    for n in range(1, 4):
        runner.run(x)
        assert len(calls) == n
    bound = runner.bind(x)
    bound.update(x)
    bound.run()
    assert len(calls) == 4


def test_the_migraphx_check_covers_fixed_axes_before_any_program_is_built(fake_mgx, mlp):
    runner = compile_model(mlp, native())
    built = len(runner.programs())
    with pytest.raises(InputError, match="axis 1 must be 4"):
        runner.run({"x": np.ones((3, 5), np.float32)})
    assert len(runner.programs()) == built
