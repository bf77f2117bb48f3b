"""`inspect` as a function: the model's signature and graph statistics, and with a target, where it runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from onnxaccel.analysis.graph_stats import GraphStats, graph_stats
from onnxaccel.analysis.placement import CAPTURE_OPTIONS, PlacementReport, analyze_placement
from onnxaccel.analysis.scaling import CostScaling, cost_scaling
from onnxaccel.model import Model, load_model
from onnxaccel.model_shapes import bind_examples
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
    #: Set when dims nothing bound took example values (inspect without a target): formulas in those dims.
    scaling: CostScaling | None = None

    @property
    def shapes_text(self) -> str:
        """``x=1x3x640x640`` for every bound input: the shapes the statistics (and placement) are for."""
        return ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in self.model.input_shapes.items())

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
            "shapes": {"input_shapes": {k: list(v) for k, v in self.model.input_shapes.items()},
                       "source": "example values" if self.scaling else "resolved",
                       "example_values": self.scaling.examples if self.scaling else {},
                       "scaling": self.scaling.to_dict() if self.scaling else None},
            "placement_shapes": ({k: list(v) for k, v in self.model.input_shapes.items()}
                                 if self.placement else None),
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

    Without a target no shape is required: dims the resolution order leaves unbound take example values, and
    the result carries formulas in them (:mod:`onnxaccel.analysis.scaling`). With a target, placement runs at
    the resolved shapes (an unbound dim is the usual error naming it). Never strict: the caller decides what a
    fallback means (the CLI's --strict fails after reporting it).
    """
    model = source if isinstance(source, Model) else load_model(source, check=check)
    if target is None:
        bound, examples = bind_examples(model, {k: tuple(v) for k, v in (shapes or {}).items()}, batch)
        stats = graph_stats(bound)
        scaling = cost_scaling(model, examples, stats, shapes, batch) if examples else None
        return InspectResult(bound, stats, warnings=list(bound.notes), scaling=scaling)
    bound = model.bind(shapes, batch=batch)
    stats = graph_stats(bound)

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
