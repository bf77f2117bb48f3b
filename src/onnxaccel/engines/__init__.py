"""Engines compile a Model for a Target into a Runner: ONNX Runtime (``ort``) and native MIGraphX. Each
implements :class:`Engine` (engines/base.py); :data:`REGISTRY` maps a target's ``@engine`` to its engine.
Several runners of one model run side by side through a :class:`RunnerPool` (engines/pool.py)."""

from __future__ import annotations

from onnxaccel import providers, startup
from onnxaccel.engines.base import BoundRun, Engine, PlacedNode, Placement, ProbeResult, Runner
from onnxaccel.engines.migraphx import MigraphxEngine
from onnxaccel.engines.ort import OrtEngine, import_ort, probe_provider
from onnxaccel.engines.pool import RunnerPool
from onnxaccel.errors import TargetError
from onnxaccel.model import Model
from onnxaccel.target import ENGINES, Target, parse_target

__all__ = ["REGISTRY", "BoundRun", "Engine", "PlacedNode", "Placement", "ProbeResult", "Runner", "RunnerPool",
           "best_target", "compile_model"]

#: ``Target.engine`` -> the engine that compiles it; its keys are target.ENGINES (a test holds them equal).
REGISTRY: dict[str, Engine] = {engine.name: engine for engine in (OrtEngine(), MigraphxEngine())}


def compile_model(model: Model, target: Target, *, strict: bool = False) -> Runner:
    """Build a Runner for the target's engine. The model should be bound (``Model.bind``)."""
    engine = REGISTRY.get(target.engine)
    if engine is None:
        raise TargetError(f"Unknown engine '{target.engine}'.", f"Use one of: {', '.join(ENGINES)}.")
    with startup.stage("session", detail=f"{target.device}/{target.precision}{_batch_of(model)}"):
        return engine.compile(model, target, strict=strict)


def _batch_of(model: Model) -> str:
    """" b64" for a model whose first input is bound to batch 64 (a start-up span's detail); "" otherwise."""
    shape = next(iter(model.input_shapes.values()), None) if model.is_bound else None
    return f" b{shape[0]}" if shape and isinstance(shape[0], int) else ""


def best_target() -> tuple[Target, list[str]]:
    """The fastest target that really loads here, and why each faster one was skipped.

    Providers are tried in their registered preference order (onnxaccel.providers.by_preference). A provider
    counts only if a session built with it keeps it first in ``get_providers()``; being listed by
    ``get_available_providers()`` says only how the wheel was built.
    """
    ort = import_ort()
    skipped = []
    available = ort.get_available_providers()
    for spec in providers.by_preference():
        target = parse_target(spec.device)
        if spec.provider not in available:
            skipped.append(f"{spec.device}: {spec.provider} is not part of the installed ONNX Runtime "
                           f"(it comes with {spec.package[0]})")
            continue
        problem = probe_provider(target)
        if problem is None:
            return target, skipped
        skipped.append(f"{spec.device}: {problem}")
    return parse_target("cpu"), skipped
