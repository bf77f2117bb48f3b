"""Achieved TFLOP/s, its share of the device's peak, and where the cell sits on the roofline.

FLOPs per inference come from ``analysis.graph_stats`` at the bound shapes (1 MAC = 2 FLOPs). Bytes moved are
an estimate with no cache reuse and no fusion: every weight read once, every intermediate tensor written once
and read once, inputs and outputs once, so the arithmetic intensity is a lower bound. FP16 halves float
weights and activations; dynamic INT8 (what ``--precision int8`` makes on the CPU) quarters weights and keeps
float activations. The roofline (Williams, Waterman, Patterson, CACM 2009): attainable = min(peak,
intensity x bandwidth); below the ridge point (peak / bandwidth) a kernel is memory-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxaccel.analysis.graph_stats import graph_stats
from onnxaccel.bench.gpu_specs import GpuSpec, peak_key

# Bytes relative to FP32 for (weights, activations) by precision.
_SCALE = {"fp32": (1.0, 1.0), "fp16": (0.5, 0.5), "int8": (0.25, 1.0)}


@dataclass(frozen=True)
class ModelCost:
    """FLOPs and estimated bytes of one inference at the bound shapes (FP32 model)."""

    flops: int
    param_bytes: int
    activation_bytes: int
    io_bytes: int
    #: Nodes whose arithmetic is not in ``flops`` (If/Loop/Scan, ops without a rule): ``flops`` is then a lower
    #: bound, and so is every FLOP/s figure made from it.
    uncounted_nodes: int = 0
    #: Nodes inside If/Loop/Scan bodies (their arithmetic is never counted).
    subgraph_nodes: int = 0
    #: ``GraphStats.coverage.to_dict()``: with ``sufficient`` False, ``flops`` covers too few of the MAC ops to
    #: give a rate, and none is reported.
    coverage: dict | None = None

    @property
    def partial(self) -> bool:
        """True when ``flops`` leaves out some arithmetic (a lower bound)."""
        return self.uncounted_nodes > 0

    def bytes_for(self, precision: str) -> int:
        """Estimated bytes moved per inference at ``precision``: weights once, activations written and read, I/O."""
        weights, acts = _SCALE.get(precision, (1.0, 1.0))
        return int(self.param_bytes * weights + 2 * self.activation_bytes * acts + self.io_bytes)

    def to_dict(self) -> dict:
        """JSON-ready form of the cost."""
        return {"flops": self.flops, "param_bytes": self.param_bytes, "activation_bytes": self.activation_bytes,
                "io_bytes": self.io_bytes, "flops_partial": self.partial, "uncounted_nodes": self.uncounted_nodes,
                "subgraph_nodes": self.subgraph_nodes, "flops_coverage": self.coverage}


def model_cost(bound_model) -> ModelCost:
    """Cost of one inference of a bound Model (shape inference on a light copy; weights are not read)."""
    import numpy as np


    stats = graph_stats(bound_model)
    io = 0
    for spec in bound_model.inputs:
        shape = bound_model.input_shapes.get(spec.name, ())
        io += int(np.prod(shape)) * _itemsize(spec.dtype)
    return ModelCost(stats.total_flops, stats.param_bytes, stats.activation_total_bytes, io,
                     uncounted_nodes=len(stats.uncounted), subgraph_nodes=stats.subgraph_nodes,
                     coverage=stats.coverage.to_dict())


def _itemsize(dtype: str) -> int:
    import numpy as np

    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 4


@dataclass(frozen=True)
class Roofline:
    """Achieved TFLOP/s and arithmetic intensity of a cell, set against the device's published peaks."""
    flops_per_inference: int
    achieved_tflops: float
    bytes_estimate: int
    intensity: float | None
    peak_tflops: float | None = None
    peak_basis: str | None = None
    bandwidth_gbps: float | None = None
    device: str | None = None
    source: str | None = None
    #: Nodes whose arithmetic ``flops_per_inference`` leaves out: every rate here is then a lower bound.
    uncounted_nodes: int = 0
    subgraph_nodes: int = 0
    coverage: dict | None = None

    @property
    def counted(self) -> bool:
        """False when the FLOP count covers too few of the MAC ops for any rate here to mean something."""
        return not self.coverage or self.coverage.get("sufficient", True)

    @property
    def pct_of_peak(self) -> float | None:
        """Achieved TFLOP/s as a percentage of the device's peak, or None without a peak."""
        return 100.0 * self.achieved_tflops / self.peak_tflops if self.peak_tflops else None

    @property
    def ridge(self) -> float | None:
        """FLOPs per byte where the device turns compute-bound."""
        if not self.peak_tflops or not self.bandwidth_gbps:
            return None
        return self.peak_tflops * 1e12 / (self.bandwidth_gbps * 1e9)

    @property
    def attainable_tflops(self) -> float | None:
        """The roofline bound at this intensity: min(peak, intensity x bandwidth), or None without both peaks."""
        if not self.peak_tflops or not self.bandwidth_gbps or self.intensity is None:
            return None
        return min(self.peak_tflops, self.intensity * self.bandwidth_gbps * 1e9 / 1e12)

    @property
    def bound(self) -> str | None:
        """"memory" or "compute": which side of the ridge point the intensity falls on, or None."""
        ridge = self.ridge
        if ridge is None or self.intensity is None:
            return None
        return "memory" if self.intensity < ridge else "compute"

    def to_dict(self) -> dict:
        """JSON-ready form of the roofline figures."""
        attainable = self.attainable_tflops
        counted = self.counted  # else every figure made from the FLOP count is left out (None)
        return {
            "flops_per_inference": self.flops_per_inference,
            "achieved_tflops": self.achieved_tflops if counted else None,
            "bytes_estimate": self.bytes_estimate, "intensity_flops_per_byte": self.intensity if counted else None,
            "device": self.device, "peak_tflops": self.peak_tflops, "peak_basis": self.peak_basis,
            "pct_of_peak": self.pct_of_peak if counted else None, "bandwidth_gbps": self.bandwidth_gbps,
            "ridge_flops_per_byte": self.ridge, "bound": self.bound if counted else None,
            "attainable_tflops": attainable if counted else None,
            "pct_of_attainable": 100.0 * self.achieved_tflops / attainable if attainable and counted else None,
            "spec_source": self.source,
            # True: flops_per_inference and the rates are lower bounds (arithmetic in If/Loop/Scan not counted)
            "flops_partial": self.uncounted_nodes > 0, "uncounted_nodes": self.uncounted_nodes,
            "subgraph_nodes": self.subgraph_nodes, "flops_coverage": self.coverage,
        }


def roofline(cost: ModelCost, *, seconds_per_inference: float, precision: str, device: str,
             options: dict[str, str], spec: GpuSpec | None) -> Roofline:
    """Achieved rate of one inference taking ``seconds_per_inference``; peaks from ``spec`` when known."""
    achieved = cost.flops / seconds_per_inference / 1e12 if seconds_per_inference > 0 else 0.0
    moved = cost.bytes_for(precision)
    intensity = cost.flops / moved if moved else None
    counts = {"uncounted_nodes": cost.uncounted_nodes, "subgraph_nodes": cost.subgraph_nodes,
              "coverage": cost.coverage}
    if spec is None:
        return Roofline(cost.flops, achieved, moved, intensity, **counts)
    key = peak_key(precision, device, options, spec)
    return Roofline(cost.flops, achieved, moved, intensity, spec.peak(key), key, spec.bandwidth_gbps, spec.name,
                    spec.source, **counts)
