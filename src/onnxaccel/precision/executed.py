"""The precision a session really computed in, node by node: what a converted model's label must say.

A model converted to FP16 is not run in FP16 everywhere: where the provider has no float16 kernel for an op,
ONNX Runtime places the node on the CPU provider and its insert-cast transformer wraps it in Cast nodes that
compute it in float32 (``InsertedPrecisionFreeCast_*`` nodes; microsoft/onnxruntime
onnxruntime/core/optimizer/insert_cast_transformer.cc, 1.32). On the CPU provider that is most of a CNN (seen with
onnxruntime 1.32.0 on x86-64: every Conv of zoo:squeezenet's FP16 model ran in float32). So the label comes from
the session: one profiled run in a session built like the runner's, whose node events carry each kernel's
provider and input/output element types (``input_type_shape``, ``output_type_shape``). Casts, copies and
(de)quantization nodes are the conversion itself and are not counted; nor are nodes without float or 8-bit
integer tensors (shape arithmetic).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnxaccel.engines.ort import capture_native_stderr, import_ort
from onnxaccel.engines.ort_ep_options import ep_environment

#: ONNX Runtime's profile names of element types, by the precision they compute in.
_PRECISION_OF = {"float16": "fp16", "bfloat16": "bf16", "float": "fp32", "double": "fp64", "int8": "int8",
                 "uint8": "int8"}
#: Nodes that only convert between precisions or move data: not counted.
_CONVERSION_OPS = frozenset({"Cast", "MemcpyToHost", "MemcpyFromHost", "QuantizeLinear", "DequantizeLinear",
                             "DynamicQuantizeLinear"})


@dataclass(frozen=True)
class ExecutedPrecision:
    """Compute nodes per precision they ran in, how that was learned, and the precision asked for."""

    asked: str
    nodes: Mapping[str, int] = field(default_factory=dict)
    method: str = "profiling"
    #: Counted nodes per provider, e.g. {"CPUExecutionProvider": 50}.
    providers: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Compute nodes counted."""
        return sum(self.nodes.values())

    def label(self) -> str:
        """'fp16' when every counted node ran in it; else e.g. 'fp16 on 2 of 50 nodes, fp32 elsewhere'."""
        ran = self.nodes.get(self.asked, 0)
        if not self.total:
            return f"{self.asked} (no compute node observed)"
        if ran == self.total:
            return self.asked
        others = "/".join(p for p, _ in Counter(self.nodes).most_common() if p != self.asked)
        return f"{self.asked} on {ran} of {self.total} nodes, {others} elsewhere"

    def to_dict(self) -> dict:
        """JSON-ready form, with the label."""
        return {"asked": self.asked, "label": self.label(), "nodes": dict(self.nodes), "total": self.total,
                "method": self.method, "providers": dict(self.providers)}


def executed_precision(runner, feeds: Mapping[str, np.ndarray], asked: str) -> ExecutedPrecision | None:
    """Profile one run of ``runner``'s model on ``feeds`` in a session built like the runner's and count its compute
    nodes per precision; None when the runner is not an ONNX Runtime one or the profiled run fails (the label
    then stays the precision asked)."""
    session_options = getattr(runner, "_session_options", None)
    providers = getattr(runner, "_providers", None)
    if session_options is None or providers is None:
        return None
    ort = import_ort()
    with tempfile.TemporaryDirectory(prefix="onnxaccel-executed-") as tmp:
        so = session_options()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "executed")
        try:
            with capture_native_stderr(), ep_environment(getattr(runner, "provider_env", {})):
                session = ort.InferenceSession(str(runner.model.path), so, providers=providers())
            session.run(None, dict(feeds))
            events = json.loads(Path(session.end_profiling()).read_text())
        except Exception:  # noqa: BLE001 - the label is a report detail; the runner itself already ran
            return None
    return precision_of_events(events, asked)


def precision_of_events(events: list[dict], asked: str) -> ExecutedPrecision:
    """:class:`ExecutedPrecision` from ONNX Runtime profile events (each node's first kernel event counts)."""
    nodes: Counter = Counter()
    providers: Counter = Counter()
    seen: set[str] = set()
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith("_kernel_time") or name in seen:
            continue
        seen.add(name)
        args = event.get("args", {})
        if args.get("op_name") in _CONVERSION_OPS:
            continue
        precision = _node_precision(args)
        if precision is not None:
            nodes[precision] += 1
            providers[args.get("provider", "?")] += 1
    return ExecutedPrecision(asked, dict(nodes), "profiling", dict(providers))


def _node_precision(args: dict) -> str | None:
    """The precision a node computed in: float16 if any of its tensors is, else 8-bit integers for an integer
    kernel, else float32; None for nodes without such tensors."""
    types = [dtype for key in ("input_type_shape", "output_type_shape") for entry in args.get(key) or ()
             for dtype in entry]
    found = {_PRECISION_OF[t] for t in types if t in _PRECISION_OF}
    for precision in ("fp16", "bf16"):
        if precision in found:
            return precision
    inputs = {_PRECISION_OF.get(t) for entry in args.get("input_type_shape") or () for t in entry}
    if "int8" in inputs:
        return "int8"
    for precision in ("fp32", "fp64"):
        if precision in found:
            return precision
    return None
