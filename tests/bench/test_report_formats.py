"""The report: a versioned JSON schema that round-trips; CSV and Markdown views; clear errors for bad files."""

from __future__ import annotations

import csv
import io
import json

import pytest

from onnxaccel.bench.report import (
    SCHEMA,
    BenchReport,
    ReportError,
    clean,
    load_report,
    render,
)
from onnxaccel.bench.report_text import CSV_COLUMNS


def test_json_round_trips_through_the_schema(cpu_sweep):
    path = cpu_sweep["paths"]["json"]
    written = json.loads(path.read_text())
    assert written["schema"] == SCHEMA == "onnxaccel.bench/2" and written["complete"] is True
    loaded = load_report(path)
    assert clean(loaded.to_dict()) == written
    again = BenchReport.from_dict(json.loads(render(loaded, "json")))
    assert clean(again.to_dict()) == written
    cell = loaded.cell("cpu/int8|batch=4|io=off|c=1")
    assert cell.latency.p50 == written["cells"][[c["id"] for c in written["cells"]].index(cell.id)]["latency"]["p50_ms"]


def test_json_holds_no_non_standard_numbers():
    report = BenchReport(model={"source": "m"}, environment={}, settings={"x": float("inf"), "y": [float("nan")]})
    text = render(report, "json")
    json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    assert '"inf"' in text and '"nan"' in text


def test_csv_has_one_row_per_cell_and_every_column(cpu_sweep):
    rows = list(csv.DictReader(io.StringIO(cpu_sweep["paths"]["csv"].read_text())))
    assert len(rows) == len(cpu_sweep["cells"]) and tuple(rows[0]) == CSV_COLUMNS
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(float(r["p50_ms"]) > 0 and float(r["throughput_items_per_s"]) > 0 for r in ok)
    failed = [r for r in rows if r["status"] == "failed"]
    assert failed and all(r["error_message"] and r["error_hint"] for r in failed)


def test_markdown_tables_cells_and_failures(cpu_sweep):
    text = cpu_sweep["paths"]["md"].read_text()
    assert text.startswith("# onnxaccel bench:") and "| cell | status | batch |" in text
    assert "## Failed cells" in text and "## Skipped" in text
    assert text.count("\n| cpu") == 8


@pytest.mark.parametrize("content,message,hint", [
    (None, "Report file not found", "onnxaccel bench --report"),
    ("not json", "is not a JSON report", "not the .csv"),
    ('{"schema": "onnxaccel.bench/1", "latency": {}}', "schema: 'onnxaccel.bench/1'", "older `onnxaccel bench`"),
    ('{"schema": "something/9"}', "is not an onnxaccel benchmark report", "--report FILE.json"),
    ('{"schema": "onnxaccel.bench/2", "model": {}, "cells": [{"id": "x"}]}', "is damaged", "without --resume"),
])
def test_bad_report_files_raise_clear_errors(tmp_path, content, message, hint):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ReportError) as err:
        load_report(path)
    assert message in err.value.message and hint in err.value.hint
