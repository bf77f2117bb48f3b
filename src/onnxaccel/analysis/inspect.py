"""`inspect` as a function: the model's signature and graph statistics, and with a target, where it runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from onnxaccel.analysis.graph_stats import GraphStats, graph_stats
from onnxaccel.analysis.placement import CAPTURE_OPTIONS, PlacementReport, analyze_placement
from onnxaccel.model import Model, load_model
from onnxaccel.pipeline import prepare
from onnxaccel.target import Target

SCHEMA = "onnxaccel.inspect/1"


@dataclass
class InspectResult:
    """What ``onnxaccel inspect`` found: the model, its graph statistics and, with a target, node placement."""
    model: Model
    stats: GraphStats
    target: Target | None = None
    placement: PlacementReport | None = None
    providers: list[str] = field(default_factory=list)
    compile_seconds: float | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def has_fallback(self) -> bool:
        """True when a GPU target left nodes to another provider (what --strict refuses)."""
        return bool(self.placement and self.target and self.target.is_gpu and self.placement.placement.fallback)

    def to_dict(self, *, nodes: bool = True) -> dict:
        """JSON-ready report (schema ``SCHEMA``) for ``inspect --json``."""
        return {
            "schema": SCHEMA,
            "model": self.model.to_dict(),
            "graph": self.stats.to_dict(nodes=nodes),
            "target": self.target.to_dict() if self.target else None,
            "providers": self.providers,
            "compile_seconds": self.compile_seconds,
            "placement": self.placement.to_dict() if self.placement else None,
            "warnings": self.warnings,
        }


def inspect_model(
    source: str | Model,
    target: Target | None = None,
    *,
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    check: bool = True,
) -> InspectResult:
    """Statistics for the bound shapes; with a target, compile it and analyze the placement too.

    Never strict: the caller decides what a fallback means (the CLI's --strict fails after reporting it).
    """
    model = source if isinstance(source, Model) else load_model(source, check=check)
    bound = model.bind(shapes, batch=batch)
    stats = graph_stats(bound)
    if target is None:
        return InspectResult(bound, stats, warnings=list(bound.notes))

    # With graph capture switched on, ONNX Runtime refuses to build a session it cannot capture, and there
    # would be no placement to show: analyze without the switch and let the verdict say what would happen.
    capture_switches = [k for k, v in target.options if k in CAPTURE_OPTIONS and v == "1"]
    analyzed = dataclasses.replace(target, options=tuple(o for o in target.options if o[0] not in capture_switches))
    prepared = prepare(bound, analyzed, shapes=shapes, batch=batch, check=check)
    warnings = list(prepared.warnings)
    if capture_switches:
        warnings.append(f"Placement analyzed without {', '.join(capture_switches)}; see the graph-capture verdict.")
    try:
        report = analyze_placement(prepared.runner)
        return InspectResult(bound, stats, target, report, list(prepared.runner.providers),
                             prepared.runner.compile_seconds, warnings)
    finally:
        prepared.close()
