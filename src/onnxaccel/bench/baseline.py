"""Compare a report against a baseline report: regressions and gains beyond noise, cell by cell.

Cells are matched by id (target with options, batch, shapes, IO binding, concurrency). A change counts when
the median latency moved by more than the larger of

* ``threshold`` (default 5%: run-to-run drift of clocks and co-tenants that no single run can see), and
* ``sigmas`` (default 3) standard errors of the difference of the two medians, from each run's own spread
  (standard error of a median ~ 1.2533 sigma / sqrt(n)),

so a noisy pair of runs needs a larger change before it is called. Throughput moves with the median latency
for single requests; with concurrency it is compared directly. A cell that ran before and fails now is a
regression; one that failed before and runs now is a gain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnxaccel.bench.cells import CellResult
from onnxaccel.bench.report import BenchReport

DEFAULT_THRESHOLD = 0.05
DEFAULT_SIGMAS = 3.0


@dataclass(frozen=True)
class CellChange:
    """How one benchmark cell moved against the baseline report, with the figures compared."""
    id: str
    verdict: str  # regression | gain | same | new | missing | now-failing | now-passing | both-failed
    old_p50_ms: float | None = None
    new_p50_ms: float | None = None
    old_throughput: float | None = None
    new_throughput: float | None = None
    #: (new - old) / old of the compared quantity (latency, or throughput with concurrency).
    change: float | None = None
    noise: float | None = None
    note: str = ""

    def to_dict(self) -> dict:
        """JSON-ready form of the change."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class BaselineComparison:
    """Every cell of a new report compared with a baseline report (``bench --baseline``)."""
    baseline: str
    threshold: float
    sigmas: float
    changes: tuple[CellChange, ...]

    def count(self, verdict: str) -> int:
        """Number of cells with the given verdict."""
        return sum(1 for c in self.changes if c.verdict == verdict)

    @property
    def regressions(self) -> list[CellChange]:
        """Cells that got slower beyond the threshold or started failing."""
        return [c for c in self.changes if c.verdict in ("regression", "now-failing")]

    @property
    def gains(self) -> list[CellChange]:
        """Cells that got faster beyond the threshold or started passing."""
        return [c for c in self.changes if c.verdict in ("gain", "now-passing")]

    def to_dict(self) -> dict:
        """JSON-ready comparison, stored in the report's ``baseline`` field."""
        return {"baseline": self.baseline, "threshold": self.threshold, "sigmas": self.sigmas,
                "regressions": len(self.regressions), "gains": len(self.gains),
                "changes": [c.to_dict() for c in self.changes]}


def compare_reports(new: BenchReport, old: BenchReport, *, baseline_name: str = "baseline",
                    threshold: float = DEFAULT_THRESHOLD, sigmas: float = DEFAULT_SIGMAS) -> BaselineComparison:
    """Compare every cell of ``new`` with the cell of the same id in ``old``.

    ``threshold`` (relative) and ``sigmas`` (standard deviations) decide when a change is beyond noise;
    cells only in ``old`` are listed as missing."""
    old_by_id = {c.id: c for c in old.cells}
    changes = [_change(cell, old_by_id.get(cell.id), threshold, sigmas) for cell in new.cells]
    new_ids = {c.id for c in new.cells}
    changes += [CellChange(c.id, "missing", note="in the baseline only") for c in old.cells if c.id not in new_ids]
    return BaselineComparison(baseline_name, threshold, sigmas, tuple(changes))


def _change(new: CellResult, old: CellResult | None, threshold: float, sigmas: float) -> CellChange:
    if old is None:
        return CellChange(new.id, "new", note="not in the baseline")
    if not new.ok or not old.ok:
        verdict = ("both-failed" if not new.ok and not old.ok else "now-failing" if not new.ok else "now-passing")
        note = (new.error or {}).get("message", "") if not new.ok else ""
        return CellChange(new.id, verdict, _p50(old), _p50(new), old.throughput, new.throughput, note=note)
    concurrent = new.cell.parallel
    if concurrent:
        a, b = old.throughput or 0.0, new.throughput or 0.0
        change = (b - a) / a if a else math.inf
        noise = threshold
        slower = change < 0
    else:
        a, b = old.latency.p50, new.latency.p50
        change = (b - a) / a if a else math.inf
        noise = max(threshold, sigmas * math.hypot(old.latency.median_noise() * a, new.latency.median_noise() * b) / a)
        slower = change > 0
    verdict = "same" if abs(change) <= noise else ("regression" if slower else "gain")
    return CellChange(new.id, verdict, old.latency.p50, new.latency.p50, old.throughput, new.throughput,
                      change, noise)


def _p50(cell: CellResult) -> float | None:
    return cell.latency.p50 if cell.ok and cell.latency else None
