"""The Engine protocol: every engine in the registry implements it, compile_model dispatches through the
registry (no per-engine branch), and an engine's probe says whether a target works here."""

from __future__ import annotations

import pytest

import onnxaccel.engines as engines
from onnxaccel.engines import REGISTRY, Engine, ProbeResult, compile_model
from onnxaccel.engines.migraphx import MigraphxEngine
from onnxaccel.engines.ort import OrtEngine
from onnxaccel.errors import TargetError
from onnxaccel.model import load_model
from onnxaccel.target import ENGINES, parse_target


def test_every_engine_a_target_can_name_is_registered_and_implements_the_protocol():
    assert tuple(REGISTRY) == ENGINES
    assert isinstance(REGISTRY["ort"], OrtEngine) and isinstance(REGISTRY["migraphx"], MigraphxEngine)
    for name, engine in REGISTRY.items():
        assert isinstance(engine, Engine) and engine.name == name


def test_compile_model_dispatches_through_the_registry(mlp_path, monkeypatch):
    seen = []

    class Recording:
        name = "ort"

        def compile(self, model, target, *, strict=False):
            seen.append((target.engine, strict))
            return "runner"

        def probe(self, target):
            return ProbeResult(True, [])

    monkeypatch.setitem(engines.REGISTRY, "ort", Recording())
    model = load_model(str(mlp_path)).bind({"x": (1, 4)})
    assert compile_model(model, parse_target("cpu"), strict=True) == "runner"
    assert seen == [("ort", True)]
    monkeypatch.delitem(engines.REGISTRY, "ort")
    with pytest.raises(TargetError, match="Unknown engine 'ort'"):
        compile_model(model, parse_target("cpu"))


def test_ort_engine_probe_loads_the_cpu_provider():
    result = REGISTRY["ort"].probe(parse_target("cpu"))
    assert result.loaded and result.providers[0] == "CPUExecutionProvider"
