"""Sweep cells: what one measurement is (``SweepCell``), what came of it (``CellResult``), and the grid.

A cell is a target (precision and provider options included), a batch size, shape bindings, IO binding on or
off, graph capture on or off, and a number of concurrent requests. Its ``id`` is stable text built from
those, so a resumed sweep and a baseline comparison match cells by id. Cells that share target, batch and
shapes share one session.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from onnxaccel.bench.stats import Histogram, LatencyStats
from onnxaccel.target import GRAPH_OPTION, Target, parse_target


@dataclass(frozen=True)
class SweepCell:
    """One measurement's configuration. ``target`` is a Target value (text is parsed once, on construction: a
    report's cells and callers that hold text); the graph-capture option is applied once too."""

    target: Target
    batch: int | None = None
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    iobinding: bool = True
    graph: bool = False
    concurrency: int = 1
    #: Free text that tells cells apart which are otherwise equal (e.g. "confirm" in tune).
    tag: str = ""
    #: Sessions of the same configuration run side by side, one thread each (Triton's instance count,
    #: trtexec's --streams): throughput from several streams on one device. Unlike ``concurrency`` (threads on
    #: one session), each instance may replay its own captured graph.
    instances: int = 1
    #: The target with graph capture switched on when ``graph`` asks and the device has the option.
    effective_target: Target = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        target = self.target if isinstance(self.target, Target) else parse_target(self.target)
        effective = target
        if self.graph and target.device in GRAPH_OPTION:
            effective = target.with_options({GRAPH_OPTION[target.device]: "1"})
        object.__setattr__(self, "target", target)  # frozen: set once, here
        object.__setattr__(self, "effective_target", effective)

    @property
    def uses_graph(self) -> bool:
        """Whether the cell's session captures a graph (asked for and possible, or in the target's options)."""
        return self.effective_target.graph_capture

    @property
    def parallel(self) -> bool:
        """Several calls in flight (threads on one session, or instances): throughput is over wall time."""
        return self.concurrency > 1 or self.instances > 1

    @property
    def shape_dict(self) -> dict[str, tuple[int, ...]]:
        """The shape bindings as a dict (input or dim name -> dims)."""
        return dict(self.shapes)

    @property
    def session_key(self) -> tuple:
        """Cells with the same key share one session (same effective target, batch, shapes and instances)."""
        # Instances get their own sessions: a session that already captured a CUDA graph for another cell's
        # buffers must not be bound again.
        return (self.effective_target, self.batch, self.shapes, self.instances)

    @property
    def id(self) -> str:
        """Stable text naming the cell, to match cells of a resumed sweep or a baseline."""
        parts = [str(self.effective_target), f"batch={self.batch if self.batch is not None else 'default'}"]
        if self.shapes:
            parts.append("shape=" + ",".join(f"{k}={'x'.join(map(str, v))}" for k, v in self.shapes))
        parts.append(f"io={'on' if self.iobinding else 'off'}")
        parts.append(f"c={self.concurrency}")
        if self.instances > 1:
            parts.append(f"i={self.instances}")
        if self.tag:
            parts.append(self.tag)
        return "|".join(parts)

    def to_dict(self) -> dict:
        """The cell as a report stores it (the target as its text)."""
        return {"target": str(self.target), "batch": self.batch, "shapes": {k: list(v) for k, v in self.shapes},
                "iobinding": self.iobinding, "graph": self.graph, "concurrency": self.concurrency, "tag": self.tag,
                "instances": self.instances}

    @classmethod
    def from_dict(cls, data: dict) -> SweepCell:
        """A cell from :meth:`to_dict`'s output (its target text parsed once)."""
        return cls(str(data["target"]), data.get("batch"), _shape_items(data.get("shapes") or {}),
                   bool(data.get("iobinding", True)), bool(data.get("graph", False)), int(data.get("concurrency", 1)),
                   str(data.get("tag", "")), int(data.get("instances", 1)))


def _shape_items(shapes: dict) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted((str(k), tuple(int(d) for d in v)) for k, v in shapes.items()))


@dataclass
class CellResult:
    """A finished cell: ``status`` "ok" with measurements, or "failed" with ``error`` (message and hint)."""

    cell: SweepCell
    status: str
    started: str
    seconds: float
    error: dict | None = None
    input_shapes: dict[str, list[int]] | None = None
    latency: LatencyStats | None = None
    timing: dict = field(default_factory=dict)
    session: dict | None = None
    transfer: dict | None = None
    telemetry: dict | None = None
    memory: dict | None = None
    roofline: dict | None = None
    accuracy: dict | None = None
    histogram: Histogram | None = None
    samples_ms: list[float] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the cell was measured (its timing stands; accuracy is judged apart)."""
        return self.status == "ok"

    @property
    def id(self) -> str:
        """The cell's id (see :attr:`SweepCell.id`)."""
        return self.cell.id

    @property
    def batch(self) -> int | None:
        """The batch the cell ran: axis 0 of its first bound input, else the batch it asked for."""
        if self.input_shapes:
            first = next(iter(self.input_shapes.values()))
            if first:
                return int(first[0])
        return self.cell.batch

    @property
    def throughput(self) -> float | None:
        """Items per second (median- or wall-based, see ``throughput_basis``); None for a failed cell."""
        return self.timing.get("throughput_items_per_s") if self.ok else None

    @property
    def accuracy_passed(self) -> bool | None:
        """The accuracy verdict: True or False when judged, None when it could not be."""
        return None if not self.accuracy or "passed" not in self.accuracy else bool(self.accuracy["passed"])

    def to_dict(self) -> dict:
        """The result as the report stores it (cell, target, timing fields flat, measurements)."""
        target = self.cell.effective_target
        out = {
            "id": self.id, "cell": self.cell.to_dict(), "target": str(target), "device": target.device,
            "precision": target.precision, "batch": self.batch, "iobinding": self.cell.iobinding,
            "graph": self.cell.uses_graph, "concurrency": self.cell.concurrency, "status": self.status,
            "started": self.started, "seconds": self.seconds, "error": self.error, "input_shapes": self.input_shapes,
            "latency": self.latency.to_dict() if self.latency else None,
        }
        out.update(self.timing)
        out.update({
            "session": self.session, "transfer": self.transfer, "telemetry": self.telemetry, "memory": self.memory,
            "roofline": self.roofline, "accuracy": self.accuracy,
            "histogram": self.histogram.to_dict() if self.histogram else None, "samples_ms": self.samples_ms,
            "warnings": self.warnings,
        })
        return out

    @classmethod
    def from_dict(cls, data: dict) -> CellResult:
        """A result from :meth:`to_dict`'s output (a report being resumed or compared)."""
        timing = {k: data[k] for k in _TIMING_KEYS if k in data}
        return cls(
            cell=SweepCell.from_dict(data["cell"]), status=data["status"], started=data.get("started", ""),
            seconds=float(data.get("seconds", 0.0)), error=data.get("error"), input_shapes=data.get("input_shapes"),
            latency=LatencyStats.from_dict(data["latency"]) if data.get("latency") else None, timing=timing,
            session=data.get("session"), transfer=data.get("transfer"), telemetry=data.get("telemetry"),
            memory=data.get("memory"), roofline=data.get("roofline"), accuracy=data.get("accuracy"),
            histogram=Histogram.from_dict(data["histogram"]) if data.get("histogram") else None,
            samples_ms=list(data.get("samples_ms") or []), warnings=list(data.get("warnings") or []),
        )


_TIMING_KEYS = ("first_run_ms", "throughput_items_per_s", "throughput_basis", "wall_throughput_items_per_s",
                "wall_seconds", "calls_per_sample", "calls")


@dataclass(frozen=True)
class Skipped:
    """A grid combination that cannot work, and why (never measured)."""

    cell: SweepCell
    reason: str

    def to_dict(self) -> dict:
        """The skipped cell's id and the reason, for the report."""
        # A graph request that cannot apply leaves the target unchanged: say so in the id.
        suffix = "|graph=on" if self.cell.graph and not self.cell.uses_graph else ""
        return {"id": self.cell.id + suffix, "reason": self.reason}


def grid(
    targets: Sequence[str],
    *,
    precisions: Sequence[str | None] = (None,),
    batches: Sequence[int | None] = (None,),
    shapes: dict[str, Sequence[int]] | None = None,
    iobinding: Sequence[bool] = (True,),
    graph: Sequence[bool] = (False,),
    concurrency: Sequence[int] = (1,),
    instances: Sequence[int] = (1,),
) -> tuple[list[SweepCell], list[Skipped]]:
    """Every combination, in that nesting order; combinations that cannot work are returned as skipped."""
    shape_items = _shape_items(shapes or {})
    cells, skipped, seen = [], [], set()
    for text, precision, batch, graph_on, io, conc, count in itertools.product(
            targets, precisions, batches, graph, iobinding, concurrency, instances):
        target = parse_target(text, precision=precision) if precision else parse_target(text)
        cell = SweepCell(target, batch, shape_items, io, graph_on, conc, instances=count)
        reason = _skip_reason(cell, target)
        key = Skipped(cell, reason).to_dict()["id"] if reason else cell.id
        if key in seen:
            continue
        seen.add(key)
        if reason:
            skipped.append(Skipped(cell, reason))
        else:
            cells.append(cell)
    return cells, skipped


def _skip_reason(cell: SweepCell, target: Target) -> str | None:
    if cell.graph and target.device not in GRAPH_OPTION:
        return f"graph capture is not an option of {target.provider}"
    if cell.uses_graph and not cell.iobinding:
        return ("graph capture needs IO binding: the captured graph replays fixed input/output addresses "
                "(ORT CUDA EP docs, 'Using CUDA Graphs')")
    if cell.uses_graph and cell.concurrency > 1:
        return "a captured graph cannot be replayed from several threads on one session (ORT CUDA EP docs)"
    if cell.concurrency > 1 and cell.instances > 1:
        return "concurrency (threads on one session) and instances (one thread per session) are alternatives"
    return None


def order_for_execution(cells: Iterable[SweepCell]) -> list[list[SweepCell]]:
    """Cells grouped by session; per device and shape, plain FP32 groups first (they provide the accuracy
    reference), the rest in grid order."""
    groups: dict[tuple, list[SweepCell]] = {}
    for cell in cells:
        groups.setdefault(cell.session_key, []).append(cell)

    def rank(item: tuple[int, list[SweepCell]]) -> tuple:
        index, group = item
        target = group[0].effective_target
        plain = target.precision == "fp32" and not target.options
        return (group[0].batch or 0, 0 if plain else 1, index)

    return [g for _, g in sorted(enumerate(groups.values()), key=rank)]
