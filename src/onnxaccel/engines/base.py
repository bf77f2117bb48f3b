"""The interfaces of the engines: an :class:`Engine` compiles a Model for a Target into a :class:`Runner`
(after Polygraphy's runners) and probes whether a target works here (:class:`ProbeResult`); Placement says
which nodes each provider got.

A Runner is a model compiled for a target. ``run(feeds)`` takes and returns numpy arrays;
``bind()`` returns a :class:`BoundRun` that keeps inputs and outputs on the target's device (IO binding),
so a timing loop measures the model, not host copies.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from onnxaccel.engines.feed_check import FeedCheck
from onnxaccel.model import Model
from onnxaccel.target import Target

CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class PlacedNode:
    """One node of the graph as a provider got it: its op type, name and domain."""

    op_type: str
    name: str
    domain: str = ""

    def to_dict(self) -> dict:
        """The node as JSON-ready values."""
        return {"op_type": self.op_type, "name": self.name, "domain": self.domain}


@dataclass(frozen=True)
class Placement:
    """Which nodes each execution provider got.

    ``method`` says how it was learned: ``assignment-info`` (ONNX Runtime >= 1.24
    ``get_provider_graph_assignment_info``), ``profiling`` (node events of one profiled run), or
    ``unknown``. ``requested`` is the provider the target asked for.
    """

    requested: str
    nodes: Mapping[str, tuple[PlacedNode, ...]] = field(default_factory=dict)
    method: str = "unknown"

    @property
    def known(self) -> bool:
        """Whether the runtime could tell the placement at all."""
        return self.method != "unknown"

    @property
    def total(self) -> int:
        """Nodes placed on any provider (Memcpy nodes included)."""
        return sum(len(v) for v in self.nodes.values())

    def count(self, provider: str) -> int:
        """Nodes ``provider`` got."""
        return len(self.nodes.get(provider, ()))

    @property
    def fallback(self) -> tuple[PlacedNode, ...]:
        """Nodes placed on another provider than the requested one (Memcpy nodes excluded)."""
        return tuple(
            n for ep, nodes in self.nodes.items() if ep != self.requested
            for n in nodes if not n.op_type.startswith("Memcpy")
        )

    @property
    def memcpy_nodes(self) -> int:
        """Copy nodes the runtime inserted between providers."""
        return sum(1 for nodes in self.nodes.values() for n in nodes if n.op_type.startswith("Memcpy"))

    def fallback_ops(self) -> Counter:
        """How many fallback nodes of each op type."""
        return Counter(n.op_type for n in self.fallback)

    def summary(self) -> str:
        """One line, e.g. 'CUDAExecutionProvider took 402/412 nodes; 10 on CPU: NonMaxSuppression x1, ...'."""
        if not self.known:
            return f"placement unknown (this ONNX Runtime cannot report it); requested {self.requested}"
        short = self.requested.replace("ExecutionProvider", "")
        total = self.total - self.memcpy_nodes
        line = f"{short} took {self.count(self.requested) - self._memcpy_on(self.requested)}/{total} nodes"
        if self.requested != CPU and self.fallback:
            ops = ", ".join(f"{op} x{n}" for op, n in self.fallback_ops().most_common())
            others = sorted({ep.replace("ExecutionProvider", "") for ep, ns in self.nodes.items()
                             if ep != self.requested and ns})
            line += f"; {len(self.fallback)} on {'/'.join(others)}: {ops}"
        if self.memcpy_nodes:
            line += f"; {self.memcpy_nodes} Memcpy node(s) inserted"
        return line

    def _memcpy_on(self, provider: str) -> int:
        return sum(1 for n in self.nodes.get(provider, ()) if n.op_type.startswith("Memcpy"))

    def to_dict(self) -> dict:
        """The placement as JSON-ready values, its summary line included."""
        return {
            "requested": self.requested,
            "method": self.method,
            "total_nodes": self.total,
            "per_provider": {ep: len(nodes) for ep, nodes in self.nodes.items()},
            "fallback": [n.to_dict() for n in self.fallback],
            "memcpy_nodes": self.memcpy_nodes,
            "summary": self.summary(),
        }


class BoundRun(abc.ABC):
    """Inputs and outputs resident on the target's device. ``run()`` leaves outputs there."""

    @abc.abstractmethod
    def update(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Copy new host values into the device-resident inputs (same shapes)."""

    @abc.abstractmethod
    def run(self) -> None:
        """Run once; outputs stay on the device."""

    @abc.abstractmethod
    def outputs(self) -> dict[str, np.ndarray]:
        """Copy the outputs of the last run to the host."""

    def input_addresses(self) -> dict[str, int] | None:
        """Device addresses of the bound inputs (C-contiguous, the shapes bound), for a caller that copies into
        them itself (serve's batch join on the GPU); None where the engine does not expose them."""
        return None


class Runner(abc.ABC):
    """A model compiled for a target.

    Feeds are checked here, so callers need not repeat the check (:meth:`check_feeds`: names, element types
    and ranks against the model's inputs, remembered per signature; an engine may check only when its runtime
    refuses a run, as ONNX Runtime checks every feed itself). Several runners of one model run side by side
    through :class:`onnxaccel.engines.pool.RunnerPool`.
    """

    model: Model
    target: Target
    #: Seconds spent creating the session / compiling the program.
    compile_seconds: float
    placement: Placement
    #: Messages the user should see (fallbacks, fixes applied); never printed by the library.
    warnings: list[str]

    @abc.abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run with host (numpy) inputs; return host outputs by name."""

    @abc.abstractmethod
    def bind(self, feeds: Mapping[str, np.ndarray]) -> BoundRun:
        """Put ``feeds`` on the device and return a device-resident run (IO binding)."""

    @property
    @abc.abstractmethod
    def providers(self) -> list[str]:
        """The providers the session actually has, in priority order."""

    def check_feeds(self, feeds: Mapping[str, object]) -> None:
        """Raise InputError where ``feeds`` do not fit the model's inputs (names, element types, ranks); a
        signature that passed once costs one lookup afterwards (engines/feed_check.py)."""
        check = self.__dict__.get("_feed_check")
        if check is None:
            check = self._feed_check = FeedCheck(self.model.inputs)
        check(feeds)

    def shrink_arenas(self) -> bool:
        """Return the unused chunks of the runtime's memory arenas after every run, where the engine can (a
        server's setting, paid for in allocation time). False where it cannot."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the session."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> dict:
        """Target, providers, compile time, placement and warnings as JSON-ready values."""
        return {
            "target": self.target.to_dict(),
            "providers": self.providers,
            "compile_seconds": self.compile_seconds,
            "placement": self.placement.to_dict(),
            "warnings": list(self.warnings),
        }


@dataclass
class ProbeResult:
    """Whether a one-node session (or program) on a target kept its provider, and if not, why and how to fix
    it; every engine's :meth:`Engine.probe` gives one, so ``doctor`` shows them alike."""

    loaded: bool
    #: ``get_providers()`` of the probe session, when one was built.
    providers: list[str]
    cause: str | None = None
    fix: str | None = None
    #: The runtime's exception text and log, verbatim.
    details: str | None = None

    def to_dict(self) -> dict:
        """The result as JSON-ready values."""
        return {"loaded": self.loaded, "providers": self.providers, "cause": self.cause, "fix": self.fix,
                "details": self.details}


@runtime_checkable
class Engine(Protocol):
    """What every engine implements (DESIGN.md, "engines"): ``engines.REGISTRY`` maps ``Target.engine`` to
    one, and ``engines.compile_model`` dispatches through it."""

    #: The ``@engine`` suffix of a target that selects it (``ort``, ``migraphx``).
    name: str

    def compile(self, model: Model, target: Target, *, strict: bool = False) -> Runner:
        """Build a Runner of ``model`` (bound) for ``target``; raise a TargetError/PlacementError that says
        how to fix a target this engine cannot run here."""
        ...

    def probe(self, target: Target) -> ProbeResult:
        """Whether ``target`` really works here: a one-node model compiled and run on it."""
        ...
