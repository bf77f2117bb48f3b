"""The benchmark report: a versioned JSON document, written atomically after every cell, and read back.

Schema ``onnxaccel.bench/2`` (docs/BENCH.md lists every field). Version 1 was the single-run output of the
first `onnxaccel bench`; it has no cells and cannot be resumed or compared against. ``plans`` (the execution
plan of every session prepared, plan.py) is optional within version 2: a report written before it loads, and
resumes, with none.

Writing replaces the file in one ``os.replace`` of a finished temporary file in the same directory (atomic
on POSIX and Windows file systems), so a sweep killed at any moment leaves the previous complete report.
Non-finite floats (an infinite error, NaN statistics) are written as the strings "inf", "-inf", "nan":
JSON has no such numbers and strict parsers reject Python's ``Infinity``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from onnxaccel.bench.cells import CellResult
from onnxaccel.bench.host import utc_now
from onnxaccel.bench.report_html import to_html
from onnxaccel.bench.report_text import to_csv, to_markdown
from onnxaccel.errors import OnnxAccelError, UsageError

SCHEMA = "onnxaccel.bench/2"
FORMATS = {".json": "json", ".csv": "csv", ".md": "markdown", ".html": "html", ".htm": "html"}


class ReportError(OnnxAccelError):
    """A report file that cannot be read, or that belongs to another schema or model."""


@dataclass
class BenchReport:
    """A benchmark report: the model, environment and settings, and one result per cell (resumable)."""
    model: dict
    environment: dict
    settings: dict
    cells: list[CellResult] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    created: str = field(default_factory=utc_now)
    updated: str = field(default_factory=utc_now)
    complete: bool = False
    notes: list[str] = field(default_factory=list)
    baseline: dict | None = None
    tune: dict | None = None
    #: The execution plan (``ExecutionPlan.to_dict()``) of every session the sweep prepared, each once.
    plans: list[dict] = field(default_factory=list)
    #: Where this process's time to its first measured result went (startup.py Startup.to_dict).
    startup: dict | None = None

    def cell(self, cell_id: str) -> CellResult | None:
        """The result of the cell with this id, or None when it has not run."""
        return next((c for c in self.cells if c.id == cell_id), None)

    def add(self, result: CellResult) -> None:
        """Add a finished cell, replacing an earlier result with the same id."""
        for index, existing in enumerate(self.cells):
            if existing.id == result.id:
                self.cells[index] = result
                break
        else:
            self.cells.append(result)
        self.updated = utc_now()

    def add_plan(self, plan: dict) -> None:
        """Record the plan of a prepared session (``ExecutionPlan.to_dict()``), unless the same plan is there."""
        if plan not in self.plans:
            self.plans.append(plan)

    @property
    def ok_cells(self) -> list[CellResult]:
        """Cells that ran to the end."""
        return [c for c in self.cells if c.ok]

    @property
    def failed_cells(self) -> list[CellResult]:
        """Cells that failed, each with its error."""
        return [c for c in self.cells if not c.ok]

    def to_dict(self) -> dict:
        """JSON-ready report (schema ``SCHEMA``) with a summary of cell counts."""
        return {
            "schema": SCHEMA, "created": self.created, "updated": self.updated, "complete": self.complete,
            "model": self.model, "environment": self.environment, "settings": self.settings,
            "summary": {"cells": len(self.cells), "ok": len(self.ok_cells), "failed": len(self.failed_cells),
                        "skipped": len(self.skipped)},
            "cells": [c.to_dict() for c in self.cells], "skipped": self.skipped, "notes": self.notes,
            "baseline": self.baseline, "tune": self.tune, "plans": self.plans,
            "startup": self.startup,
        }

    @classmethod
    def from_dict(cls, data: dict, *, where: str = "the report") -> BenchReport:
        """Read a report back from its JSON form; a ReportError names ``where`` when it is not one."""
        schema = data.get("schema") if isinstance(data, dict) else None
        if schema != SCHEMA:
            hint = ("It was written by an older `onnxaccel bench` (single run, no cells); run the benchmark again."
                    if schema == "onnxaccel.bench/1"
                    else "Pass a JSON report written by `onnxaccel bench --report FILE.json`.")
            raise ReportError(f"{where} is not an onnxaccel benchmark report of schema {SCHEMA} "
                              f"(schema: {schema!r}).", hint)
        try:
            return cls(
                model=dict(data["model"]), environment=dict(data.get("environment") or {}),
                settings=dict(data.get("settings") or {}),
                cells=[CellResult.from_dict(c) for c in data.get("cells") or []],
                skipped=list(data.get("skipped") or []), created=data.get("created", ""),
                updated=data.get("updated", ""), complete=bool(data.get("complete", False)),
                notes=list(data.get("notes") or []), baseline=data.get("baseline"), tune=data.get("tune"),
                plans=[dict(p) for p in data.get("plans") or []], startup=data.get("startup"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ReportError(f"{where} is damaged: {type(exc).__name__}: {exc}.",
                              "Run the benchmark again (or without --resume) to write a new report.") from exc


def clean(value):
    """A copy that JSON can hold: non-finite floats become strings, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return clean(value.item())
    return value


def report_format(path: Path) -> str:
    """The report format for a file's suffix (json, csv, markdown, html); a UsageError for any other."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(f"Cannot write a report to '{path}': unknown file type '{path.suffix}'.",
                         "Use --report FILE.json, FILE.csv, FILE.md or FILE.html (repeat --report for several).")
    return fmt


def check_report_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Validate report paths before any work starts: a known suffix and a directory that can be created."""
    out = []
    for raw in paths:
        path = Path(raw).expanduser()
        report_format(path)
        if path.exists() and path.is_dir():
            raise UsageError(f"--report {path} is a directory.", "Give a file name, e.g. --report out/bench.json.")
        out.append(path)
    return out


def render(report: BenchReport, fmt: str) -> str:
    """The report as text in ``fmt``."""
    if fmt == "json":
        return json.dumps(clean(report.to_dict()), indent=1) + "\n"
    if fmt == "csv":
        return to_csv(report)
    if fmt == "markdown":
        return to_markdown(report)
    return to_html(report)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so a crash never leaves half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def write_reports(report: BenchReport, paths: Sequence[Path]) -> None:
    """Write the report to every path, each in the format its suffix names."""
    for path in paths:
        write_atomic(path, render(report, report_format(path)))


def load_report(path: str | os.PathLike) -> BenchReport:
    """Read a JSON benchmark report; a ReportError with a hint when it is missing or not one."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ReportError(f"Report file not found: {path}", "Check the path; reports are written by "
                          "`onnxaccel bench --report FILE.json`.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path} is not a JSON report: {exc}.",
                          "Pass the .json report (not the .csv, .md or .html one).") from exc
    return BenchReport.from_dict(data, where=str(path))
