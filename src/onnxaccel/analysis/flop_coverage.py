"""How much of a model's arithmetic a FLOP count covers, and why the rest is missing.

A FLOP total is only worth printing when it covers the nodes that carry the cost. A graph whose MatMuls
(or Conv/Gemm, the ops in ``MAC_OPS``) went uncounted because shape inference stopped early has a total of
a few hundred FLOPs: a "lower bound" that says nothing. :class:`FlopCoverage` counts the nodes that do
arithmetic (every op outside ``ZERO_COST``) and the MAC ops among them, counted against present, and decides
whether the total is a figure (``sufficient``) or only a share to report with its reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from onnxaccel.analysis.flops_rules import MAC_OPS, ZERO_COST

#: Below this share of the MAC ops counted (by number of nodes), a FLOP total is not shown as a figure.
MIN_MAC_SHARE = 0.5


class _Node(Protocol):
    op_type: str
    domain: str
    counted: bool
    uncounted_reason: str | None


@dataclass(frozen=True)
class FlopCoverage:
    """Counted against present: nodes that do arithmetic, and MAC ops (per op type); why the rest is missing."""

    arithmetic_nodes: int
    counted_nodes: int
    #: op type -> (counted, present) for the MAC ops of the graph (MatMul, Conv, Gemm, Attention...).
    mac_ops: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Why nodes went uncounted, most frequent first (``uncounted_reason`` values, with the cause added).
    reasons: tuple[str, ...] = ()

    @property
    def mac_nodes(self) -> int:
        """MAC op nodes in the graph."""
        return sum(total for _, total in self.mac_ops.values())

    @property
    def mac_counted(self) -> int:
        """MAC op nodes whose cost is in the total."""
        return sum(counted for counted, _ in self.mac_ops.values())

    @property
    def complete(self) -> bool:
        """True when every node that does arithmetic is counted."""
        return self.counted_nodes == self.arithmetic_nodes

    @property
    def share(self) -> float:
        """Counted share of the nodes that do arithmetic (1.0 for a graph with none)."""
        return self.counted_nodes / self.arithmetic_nodes if self.arithmetic_nodes else 1.0

    @property
    def mac_share(self) -> float | None:
        """Counted share of the MAC op nodes, or None when the graph has none."""
        return self.mac_counted / self.mac_nodes if self.mac_nodes else None

    @property
    def sufficient(self) -> bool:
        """Whether the total is a figure worth printing: at least ``MIN_MAC_SHARE`` of the MAC ops counted (of
        the arithmetic nodes, in a graph without MAC ops)."""
        share = self.mac_share if self.mac_share is not None else self.share
        return self.complete or share >= MIN_MAC_SHARE

    def text(self) -> str:
        """``8 of 94 nodes that do arithmetic counted (0 of 24 MatMul)``."""
        macs = ", ".join(f"{counted} of {total} {op}" for op, (counted, total) in self.mac_ops.items())
        return (f"{self.counted_nodes} of {self.arithmetic_nodes} nodes that do arithmetic counted"
                + (f" ({macs})" if macs else ""))

    def why(self) -> str:
        """The reasons the uncounted nodes are missing, as one clause (empty when complete)."""
        return "; ".join(self.reasons)

    def to_dict(self) -> dict:
        """JSON-ready form: counts, shares, whether the total is a figure, and the reasons."""
        return {
            "arithmetic_nodes": self.arithmetic_nodes, "counted_nodes": self.counted_nodes,
            "share": round(self.share, 4), "mac_nodes": self.mac_nodes, "mac_counted": self.mac_counted,
            "mac_share": None if self.mac_share is None else round(self.mac_share, 4),
            "mac_ops": {op: {"counted": c, "total": t} for op, (c, t) in self.mac_ops.items()},
            "complete": self.complete, "sufficient": self.sufficient, "reasons": list(self.reasons),
        }


def flop_coverage(nodes: Iterable[_Node], *, shape_inference_issue: str | None = None) -> FlopCoverage:
    """The coverage of a graph's per-node counts (``NodeStats``); ``shape_inference_issue`` says why shapes
    may be unknown (e.g. symbolic shape inference unavailable) and is added to that reason."""
    arithmetic = counted = 0
    macs: dict[str, list[int]] = {}
    reasons: Counter = Counter()
    for node in nodes:
        domain = node.domain if node.domain not in ("", "ai.onnx") else ""
        if (domain, node.op_type) in ZERO_COST:
            continue
        arithmetic += 1
        counted += node.counted
        if node.op_type in MAC_OPS:
            name = node.op_type if not domain else f"{domain}.{node.op_type}"
            entry = macs.setdefault(name, [0, 0])
            entry[0] += node.counted
            entry[1] += 1
        if not node.counted:
            reasons[node.uncounted_reason or "not counted"] += 1
    texts = []
    for reason, count in reasons.most_common():
        if reason == "a shape it needs is unknown" and shape_inference_issue:
            reason = f"a shape it needs is unknown, because {shape_inference_issue}"
        texts.append(f"{count} node(s): {reason}")
    return FlopCoverage(arithmetic, counted, {op: (c, t) for op, (c, t) in macs.items()}, tuple(texts))
