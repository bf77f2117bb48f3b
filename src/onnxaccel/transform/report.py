"""The optimize report: what changed (nodes by op type, size, precision), how accurate the result is, how long
it takes to compile cold and warm, and how to run it."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from onnxaccel.precision.fp16 import PRECISION_KEY, weight_bytes_by_type
from onnxaccel.transform.files import file_size

SCHEMA = "onnxaccel.optimize/1"


@dataclass
class ModelSummary:
    """A model file at a glance (nodes, op counts, weight bytes per type, opset, inputs, precision),
    for the before/after of an optimize report."""
    path: str
    size_bytes: int
    nodes: int
    ops: dict[str, int]
    weights: dict[str, int]
    opset: int
    ir_version: int
    precision: str
    inputs: dict[str, list]

    @classmethod
    def of(cls, path: Path, proto: onnx.ModelProto | None = None) -> ModelSummary:
        """Summarize the model at ``path`` (``proto`` when already loaded; external data is not read)."""
        proto = proto if proto is not None else onnx.load(str(path), load_external_data=False)
        ops = Counter((f"{n.domain}." if n.domain not in ("", "ai.onnx") else "") + n.op_type for n in proto.graph.node)
        meta = {p.key: p.value for p in proto.metadata_props}
        initializers = {t.name for t in proto.graph.initializer}
        inputs = {v.name: [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                           for d in v.type.tensor_type.shape.dim]
                  for v in proto.graph.input if v.name not in initializers}
        return cls(str(path), file_size(Path(path)), len(proto.graph.node), dict(sorted(ops.items())),
                   weight_bytes_by_type(proto),
                   next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0),
                   proto.ir_version, meta.get(PRECISION_KEY, "fp32"), inputs)

    def to_dict(self) -> dict:
        """The summary as JSON-ready values."""
        return {"path": self.path, "size_bytes": self.size_bytes, "nodes": self.nodes, "ops": self.ops,
                "weights_bytes_by_type": self.weights, "opset": self.opset, "ir_version": self.ir_version,
                "precision": self.precision, "inputs": self.inputs}


@dataclass
class StepRecord:
    """One optimize step: its name, how long it took, the node count after it and its details."""
    name: str
    seconds: float
    nodes_after: int
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The step as JSON-ready values (seconds rounded to 0.1 ms)."""
        return {"name": self.name, "seconds": round(self.seconds, 4), "nodes_after": self.nodes_after,
                "detail": self.detail}


@dataclass
class OptimizeReport:
    """What ``onnxaccel optimize`` did: the model before and after, each step, precision and
    accuracy results, compile times and warnings."""
    source: str
    output: str
    target: str
    before: ModelSummary
    after: ModelSummary | None = None
    steps: list[StepRecord] = field(default_factory=list)
    precision: dict = field(default_factory=dict)
    accuracy: dict = field(default_factory=dict)
    compile: dict = field(default_factory=dict)
    run_with: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    passed: bool = True
    created: float = field(default_factory=time.time)
    #: What ``--embed-preprocess`` put into the graph (None: nothing).
    embedded_preprocess: dict | None = None
    #: Symbolic dims nothing bound, run by the gate at example values (model_shapes.UnboundDim.to_dict()).
    example_dims: list[dict] = field(default_factory=list)

    def op_changes(self) -> list[tuple[str, int, int]]:
        """(op, before, after) for every op whose count changed, largest change first."""
        after = self.after.ops if self.after else {}
        names = set(self.before.ops) | set(after)
        rows = [(op, self.before.ops.get(op, 0), after.get(op, 0)) for op in names]
        return sorted((r for r in rows if r[1] != r[2]), key=lambda r: (-abs(r[2] - r[1]), r[0]))

    def to_dict(self) -> dict:
        """The report as JSON-ready values, with its schema version and the op count changes."""
        return {
            "schema": SCHEMA, "source": self.source, "output": self.output, "target": self.target,
            "passed": self.passed, "created": self.created,
            "before": self.before.to_dict(), "after": self.after.to_dict() if self.after else None,
            "op_changes": [{"op": op, "before": b, "after": a, "delta": a - b} for op, b, a in self.op_changes()],
            "steps": [s.to_dict() for s in self.steps], "precision": self.precision, "accuracy": self.accuracy,
            "compile": self.compile, "run_with": self.run_with, "warnings": self.warnings, "notes": self.notes,
            "embedded_preprocess": self.embedded_preprocess, "example_dims": self.example_dims,
        }
