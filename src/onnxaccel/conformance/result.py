"""Results of `onnxaccel check`: one CaseResult per test case, a CheckReport for the run."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from onnxaccel.compare.tolerance import OutputCheck

SCHEMA = "onnxaccel.check/1"
STATUSES = ("pass", "fail", "error", "skipped")


@dataclass
class CaseResult:
    """``status`` is pass (every output within tolerance), fail (an output is not), error (the case could not
    run: the onnxaccel error's message and hint) or skipped (``reason``)."""

    name: str
    folder: str
    status: str
    seconds: float = 0.0
    data_sets: int = 0
    outputs: list[OutputCheck] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    reason: str | None = None
    error: str | None = None
    hint: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def worst(self) -> OutputCheck | None:
        """The output that failed worst; on a pass, the one with the largest absolute error."""
        if not self.outputs:
            return None
        failed = [o for o in self.outputs if not o.passed]
        if failed:
            return max(failed, key=lambda o: (o.worst_score, o.max_abs if o.max_abs == o.max_abs else 0.0))
        return max(self.outputs, key=lambda o: o.max_abs if o.max_abs == o.max_abs else 0.0)

    def detail(self) -> str:
        """One line for a table: the worst error, the error message or the reason for skipping."""
        if self.status == "error":
            return (self.error or "").strip().splitlines()[0] if self.error else "error"
        if self.status == "skipped":
            return self.reason or "skipped"
        worst = self.worst
        if worst is None:
            return "no outputs to compare"
        if self.status == "fail":
            return worst.summary()
        return f"max abs err {worst.max_abs:.2g}" if not worst.tolerance.exact else "exact match"

    def to_dict(self) -> dict:
        """JSON-ready form of the case's result, with its worst output."""
        worst = self.worst
        return {"name": self.name, "folder": self.folder, "status": self.status, "seconds": self.seconds,
                "data_sets": self.data_sets, "providers": self.providers, "reason": self.reason,
                "error": self.error, "hint": self.hint, "warnings": self.warnings,
                "worst_output": worst.name if worst else None,
                "max_abs": worst.to_dict()["max_abs"] if worst else None,
                "max_rel": worst.to_dict()["max_rel"] if worst else None,
                "mismatched": worst.mismatched if worst else None,
                "outputs": [o.to_dict() for o in self.outputs]}


@dataclass
class CheckReport:
    """Every case of one `check` run, with what really ran: the target asked for, the providers sessions got,
    the precision and how it was obtained."""

    target: str
    precision: str
    tolerance: dict
    cases: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Number of cases per status, every status present (0 when none)."""
        found = Counter(c.status for c in self.cases)
        return {s: found.get(s, 0) for s in STATUSES}

    @property
    def providers(self) -> list[str]:
        """The first provider of every session that ran, most used first."""
        return [p for p, _ in Counter(c.providers[0] for c in self.cases if c.providers).most_common()]

    @property
    def compared(self) -> int:
        """Cases whose outputs were compared with the expected ones (passed or failed)."""
        counts = self.counts()
        return counts["pass"] + counts["fail"]

    @property
    def ok(self) -> bool:
        """True when no case failed or errored and at least one was compared: skipped cases do not count,
        but a run that skipped every case checked nothing and is not a pass."""
        counts = self.counts()
        return counts["fail"] == 0 and counts["error"] == 0 and self.compared > 0

    @property
    def exit_code(self) -> int:
        """The command's exit status: 0 when ok, else 1."""
        return 0 if self.ok else 1

    def summary(self) -> str:
        """One line of counts per status."""
        c = self.counts()
        line = (f"{c['pass']} passed, {c['fail']} failed, {c['error']} errored, {c['skipped']} skipped "
                f"in {self.seconds:.1f} s")
        return line if self.compared or c["error"] else line + " (nothing compared)"

    def to_dict(self) -> dict:
        """JSON-ready report (schema ``SCHEMA``) for ``check --json``."""
        return {"schema": SCHEMA, "target": self.target, "precision": self.precision,
                "providers": self.providers, "tolerance": self.tolerance, "summary": self.counts(),
                "compared": self.compared, "passed": self.ok, "seconds": self.seconds, "notes": self.notes,
                "cases": [c.to_dict() for c in self.cases]}
