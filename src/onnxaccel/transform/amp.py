"""Automatic mixed precision: FP16 everywhere except the nodes whose FP16 output breaks the tolerance.

The search (after onnxconverter-common's auto_convert_mixed_precision and Polygraphy's ``debug precision``,
but driven by the divergence finder instead of re-validating every node):

1. Convert with the block list so far and judge the result on the sample inputs (the accuracy gate).
2. If it fails, ask the locator for the first node whose FP16 output diverges from FP32 while its inputs
   agree (``analysis.bisect.find_divergence``, a bisection over the topological order), keep that node in
   FP32, and repeat. Keeping a node also keeps its output FP32, so the next round finds the next culprit
   (often a consumer that overflows when the value is cast back to FP16).
3. If the locator names nothing new while the gate still fails (error accumulated over many nodes, each
   within tolerance), bisect over the topological order for the shortest prefix of nodes that must stay
   FP32 for the gate to pass: log2(N) more judgements.

The callables keep this module free of running and comparing (see gate.py for why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnxaccel.precision.fp16 import convert_fp16

#: judge(candidate_proto) -> object with .passed and .to_dict()
Judge = Callable[[onnx.ModelProto], Any]
#: locate(keep_fp32) -> (node name or None, message)
Locate = Callable[[set[str]], tuple[str | None, str]]


@dataclass
class AmpStep:
    """One step of the mixed-precision search: how nodes were picked to stay FP32, which, and why."""
    method: str  # divergence | prefix-bisection
    nodes: list[str]
    op_types: list[str]
    detail: str

    def to_dict(self) -> dict:
        """The step as JSON-ready values."""
        return {"method": self.method, "nodes": self.nodes, "op_types": self.op_types, "detail": self.detail}


@dataclass
class AmpResult:
    """The outcome of the FP16 search: the model, the nodes kept in FP32, the steps taken and whether
    the last candidate passed the accuracy gate."""
    proto: onnx.ModelProto = field(repr=False)
    keep_fp32: list[str]
    steps: list[AmpStep]
    passed: bool
    judgements: int
    verdict: Any = field(repr=False, default=None)

    def to_dict(self) -> dict:
        """The result as JSON-ready values (the model itself left out)."""
        return {"passed": self.passed, "keep_fp32": self.keep_fp32, "steps": [s.to_dict() for s in self.steps],
                "judgements": self.judgements}


def auto_mixed_precision(
    proto: onnx.ModelProto,
    judge: Judge,
    locate: Locate,
    *,
    op_block_list: Iterable[str] = (),
    keep_fp32: Iterable[str] = (),
    max_located: int = 32,
    provider: str | None = None,
) -> AmpResult:
    """Search the FP32 node set for ``proto`` (FP32, weights loaded, nodes named)."""
    ops = {n.name: n.op_type for n in proto.graph.node}
    order = [n.name for n in proto.graph.node]
    keep = set(keep_fp32)
    steps: list[AmpStep] = []
    judgements = 0

    def attempt(nodes: set[str]):
        nonlocal judgements
        candidate = convert_fp16(proto, op_block_list=op_block_list, node_block_list=nodes, provider=provider)
        judgements += 1
        return candidate, judge(candidate)

    candidate, verdict = attempt(keep)
    located = 0
    while not verdict.passed and located < max_located:
        node, message = locate(keep)
        if node is None or node in keep or node not in ops:
            break
        keep.add(node)
        located += 1
        steps.append(AmpStep("divergence", [node], [ops[node]], message))
        candidate, verdict = attempt(keep)
    if not verdict.passed:
        rest = [n for n in order if n not in keep]
        k = _shortest_passing_prefix(rest, keep, attempt)
        if k is not None:
            prefix = rest[:k]
            keep.update(prefix)
            steps.append(AmpStep("prefix-bisection", prefix, [ops[n] for n in prefix],
                                 f"no single node explains the remaining error; the first {k} of {len(rest)} "
                                 "FP16 nodes (topological order) stay FP32"))
            candidate, verdict = attempt(keep)
    return AmpResult(candidate, sorted(keep, key=order.index), steps, bool(verdict.passed), judgements, verdict)


def _shortest_passing_prefix(rest: list[str], keep: set[str], attempt) -> int | None:
    """Smallest k such that keeping ``rest[:k]`` too passes; None when even all of them fail."""
    lo, hi = 0, len(rest)
    if not attempt(keep | set(rest))[1].passed:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if attempt(keep | set(rest[:mid]))[1].passed:
            hi = mid
        else:
            lo = mid
    return hi
