"""Engines compile a Model for a Target into a Runner: ONNX Runtime (``ort``) and native MIGraphX. Each
implements :class:`Engine` (engines/base.py); :data:`REGISTRY` maps a target's ``@engine`` to its engine.
Several runners of one model run side by side through a :class:`RunnerPool` (engines/pool.py).

Nothing heavy is imported with the package: each engine module (ONNX Runtime's with onnx and numpy, MIGraphX's)
is imported when its engine is first used, and the classes named here on first access (PEP 562), so a module
that needs only ``engines.ort_log`` or the CPU engine does not pay for the rest."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

from onnxaccel import providers, startup
from onnxaccel.errors import TargetError
from onnxaccel.target import ENGINES, parse_target

if TYPE_CHECKING:
    from onnxaccel.engines.base import BoundRun, Engine, PlacedNode, Placement, ProbeResult, Runner
    from onnxaccel.engines.pool import RunnerPool
    from onnxaccel.model import Model
    from onnxaccel.target import Target

__all__ = ["REGISTRY", "BoundRun", "Engine", "PlacedNode", "Placement", "ProbeResult", "Runner", "RunnerPool",
           "best_target", "compile_model"]

#: Public class -> the module that defines it (imported on first access).
_LAZY = {**dict.fromkeys(("BoundRun", "Engine", "PlacedNode", "Placement", "ProbeResult", "Runner"),
                         "onnxaccel.engines.base"), "RunnerPool": "onnxaccel.engines.pool"}


def __getattr__(name: str) -> Any:
    """A public class, imported from its module on first access and kept here (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


class _Registry(MutableMapping):
    """Engines by name, each made (and its module imported) on first use; otherwise a dict."""

    def __init__(self, makers: dict[str, Callable[[], Engine]]):
        self._makers = dict(makers)
        self._made: dict[str, Engine] = {}

    def __getitem__(self, name: str) -> Engine:
        if name not in self._made:
            self._made[name] = self._makers[name]()  # KeyError for an unknown name, as a dict
        return self._made[name]

    def __setitem__(self, name: str, engine: Engine) -> None:
        self._makers[name] = lambda: engine
        self._made[name] = engine

    def __delitem__(self, name: str) -> None:
        del self._makers[name]
        self._made.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def _ort_engine() -> Engine:
    from onnxaccel.engines.ort import OrtEngine

    return OrtEngine()


def _migraphx_engine() -> Engine:
    from onnxaccel.engines.migraphx import MigraphxEngine

    return MigraphxEngine()


#: ``Target.engine`` -> the engine that compiles it; its keys are target.ENGINES (a test holds them equal).
REGISTRY: MutableMapping[str, Engine] = _Registry({"ort": _ort_engine, "migraphx": _migraphx_engine})


def compile_model(model: Model, target: Target, *, strict: bool = False) -> Runner:
    """Build a Runner for the target's engine. The model should be bound (``Model.bind``)."""
    engine = REGISTRY.get(target.engine)
    if engine is None:
        raise TargetError(f"Unknown engine '{target.engine}'.", f"Use one of: {', '.join(ENGINES)}.")
    with startup.stage("session", detail=f"{target.device}/{_precision_of(model, target)}{_batch_of(model)}"):
        return engine.compile(model, target, strict=strict)


def _precision_of(model: Model, target: Target) -> str:
    """The precision a start-up span names: the target's, or for a model converted here (compiled at 'fp32': no
    further conversion) the one its metadata records (precision/fp16.py PRECISION_KEY, "onnxaccel.precision"),
    e.g. "fp16 model", never "fp32" for an FP16 model."""
    if target.precision == "fp32":
        converted = model.metadata.get("onnxaccel.precision")
        if converted and converted != "fp32":
            return f"{converted} model"
    return target.precision


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
    from onnxaccel.engines.ort import import_ort, probe_provider

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
