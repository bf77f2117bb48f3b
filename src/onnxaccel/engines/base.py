"""The interfaces of the engines: an :class:`Engine` compiles a Model for a Target into a :class:`Runner`
(after Polygraphy's runners) and probes whether a target works here (:class:`ProbeResult`); Placement says
which nodes each provider got.

A Runner is a model compiled for a target. ``run(feeds)`` takes and returns numpy arrays;
``bind()`` returns a :class:`BoundRun` that keeps inputs and outputs on the target's device (IO binding),
so a timing loop measures the model, not host copies. Both check the feeds once (the template in
:class:`Runner`) and call the engine's ``_run``/``_bind``.
"""

from __future__ import annotations

import abc
import functools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from onnxaccel.feeds_check import FeedCheck
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


class HostBoundRun(BoundRun):
    """The binding of a runner that has no device-resident one: the feeds stay on the host and every
    ``run()`` is a plain run of them (unchecked: they were checked when bound)."""

    def __init__(self, runner: Runner, feeds: Mapping[str, np.ndarray]) -> None:
        self.runner = runner
        self.feeds = dict(feeds)
        self._outputs: dict[str, np.ndarray] | None = None

    def update(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Replace the values of the inputs given."""
        self.feeds.update(feeds)

    def run(self) -> None:
        """Run once on the feeds held."""
        self._outputs = self.runner.run_unchecked(self.feeds)

    def outputs(self) -> dict[str, np.ndarray]:
        """The last run's outputs (running once first if nothing ran yet)."""
        if self._outputs is None:
            self.run()
        return dict(self._outputs)


class Runner(abc.ABC):
    """A model compiled for a target: a template, after Polygraphy's ``BaseRunner`` (``infer`` checks the feeds
    against the input metadata, then calls the runner's ``infer_impl``; NVIDIA/TensorRT
    tools/Polygraphy/polygraphy/backend/base/runner.py).

    :meth:`run` and :meth:`bind` check the feeds once, with the runner's :attr:`feed_check` (feeds_check.py:
    names, element types and ranks, remembered per signature), then call the engine's :meth:`_run` or
    :meth:`_bind`. Engines implement those two and never check feeds themselves. Two class attributes set the
    check's rules per engine: :attr:`casts_feeds` and :attr:`checks_axes`. A caller that checked the feeds
    already (serve, at the protocol edge: serve/signature.py; RunnerPool's runs) calls :meth:`run_unchecked`.
    Whichever entry ran, a run the engine refused is worded by the check where the feeds do not fit (fixed axes
    included), so a runtime that checks feeds itself (ONNX Runtime) costs nothing more on the runs it takes.

    A runner that replaces :meth:`run` whole (one written outside onnxaccel, checking in its own way) needs no
    ``_run``: its ``_run`` is then its ``run``. Several runners of one model
    run side by side through :class:`onnxaccel.engines.pool.RunnerPool`.
    """

    model: Model
    target: Target
    #: Seconds spent creating the session / compiling the program.
    compile_seconds: float
    placement: Placement
    #: Messages the user should see (fallbacks, fixes applied); never printed by the library.
    warnings: list[str]
    #: The engine casts a feed to its input's dtype where no value changes (feeds_check.conform), so the check
    #: lets such dtypes through; else only the input's own dtype passes.
    casts_feeds: ClassVar[bool] = False
    #: The check covers fixed axes too; False where the runtime checks them itself (ONNX Runtime), whose
    #: refusal the check then words.
    checks_axes: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # Set before ABCMeta collects the abstract methods, so such a runner can be instantiated.
        if "run" in cls.__dict__ and getattr(cls._run, "__isabstractmethod__", False):
            cls._run = _run_replaced

    # -- the template --------------------------------------------------------------------------------------

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run with host (numpy) inputs; return host outputs by name. InputError where ``feeds`` do not fit."""
        self.feed_check(feeds)
        return self.run_unchecked(feeds)

    def run_unchecked(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """:meth:`run` for feeds the caller has checked: nothing is added to the engine's run; a run the engine
        refuses is still worded by the check where the feeds do not fit."""
        try:
            return self._run(feeds)
        except Exception as exc:
            found = self.feed_check.problem(feeds, axes=True)
            if found is None:
                raise
            raise self.feed_check.error(found) from exc

    def bind(self, feeds: Mapping[str, np.ndarray], **options) -> BoundRun:
        """Put ``feeds`` on the device and return a device-resident run (IO binding); the feeds are checked
        here, once, not by the bound run's ``update()``/``run()`` (what a timing loop calls). ``options`` go to
        the engine's :meth:`_bind`."""
        self.feed_check(feeds)
        return self._bind(feeds, **options)

    def check_feeds(self, feeds: Mapping[str, object]) -> None:
        """Raise InputError where ``feeds`` do not fit the model's inputs (what :meth:`run` checks)."""
        self.feed_check(feeds)

    @functools.cached_property
    def feed_check(self) -> FeedCheck:
        """The runner's one feed check (made at first use, then an attribute of the runner)."""
        return FeedCheck(self.model.inputs, casts=self.casts_feeds, axes=self.checks_axes)

    # -- what each engine implements -------------------------------------------------------------------------

    @abc.abstractmethod
    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on feeds that were checked (or that the caller vouches for); host outputs by name. Raise the
        engine's error where the runtime fails: the template words it where the feeds were at fault."""

    def _bind(self, feeds: Mapping[str, np.ndarray], **options) -> BoundRun:
        """A device-resident run of checked ``feeds``; by default a :class:`HostBoundRun` (no device binding)."""
        return HostBoundRun(self, feeds)

    @property
    @abc.abstractmethod
    def providers(self) -> list[str]:
        """The providers the session actually has, in priority order."""

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


def _run_replaced(self: Runner, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``_run`` of a runner that replaces ``run`` whole: its own ``run``."""
    return type(self).run(self, feeds)


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
