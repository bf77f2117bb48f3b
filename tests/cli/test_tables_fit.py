"""Every command's main table at 80 and 120 columns: no number split over two lines or cut (issue 23).

Each command runs once for real (the CLI, real ONNX Runtime sessions on a small MLP and the pretrained
classifier); the tables it prints are caught, and the same table objects are then rendered at widths 1000, 120
and 80. Every numeric token of the 1000-column render must appear, whole, in the narrow renders ("120.745"
printed as "120." over "745", or cut to "120.…", fails), and no line may be wider than the terminal.
"""

from __future__ import annotations

import io
import os
import re
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from onnxaccel.cli import (
    bench, cache, check, common, compare, doctor, inspect, loadtest, monitor, optimize, profile, run, tune, zoo,
)
from onnxaccel.cli.main import app
from onnxaccel.loadtest.results import LevelResult, LoadtestConfig, LoadtestReport
from tests.model_builders import make_mlp

runner = CliRunner()
MODULES = (bench, cache, check, common, compare, doctor, inspect, loadtest, monitor, optimize, profile, run, tune, zoo)
#: A number as the tables print it (1.23, 12,345.6, 3.4e-03, 1.23/113, 45%, 7.82M), not digits inside a name.
NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d+(?:[.,:/]\d+)*(?:e[-+]?\d+)?[kMGT%]?(?![A-Za-z0-9_])")


class Catcher(Console):
    """A console that keeps every table printed to it (and prints nothing)."""

    def __init__(self) -> None:
        super().__init__(file=io.StringIO(), width=1000)
        self.tables: list[Table] = []

    def print(self, *objects, **kwargs) -> None:  # noqa: D102 - Console.print
        self.tables += [o for o in objects if isinstance(o, Table)]


@pytest.fixture
def catch(monkeypatch) -> Catcher:
    catcher = Catcher()
    for module in MODULES:
        if hasattr(module, "console"):
            monkeypatch.setattr(module, "console", catcher)
    return catcher


def render(table: Table, width: int) -> str:
    out = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False)
    out.print(table)
    return out.file.getvalue()


def assert_numbers_whole(tables: list[Table]) -> None:
    assert tables, "the command printed no table"
    for table in tables:
        wide = render(table, 1000)
        numbers = Counter(NUMBER.findall(wide))
        for width in (120, 80):
            narrow = render(table, width)
            assert max(map(len, narrow.splitlines())) <= width, narrow
            missing = numbers - Counter(NUMBER.findall(narrow))
            assert not missing, f"split or cut at {width} columns: {dict(missing)}\n{narrow}\nwide:\n{wide}"


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    return make_mlp(tmp_path_factory.mktemp("tables") / "a_model_with_a_rather_long_file_name_mlp.onnx")


@pytest.mark.parametrize("args", [
    ["bench", "{m}", "-t", "cpu", "-t", "cpu/int8", "--batch", "1,64", "--runs", "5", "--warmup", "1",
     "--no-telemetry"],
    ["run", "{m}", "-t", "cpu"],
    ["inspect", "{m}", "-t", "cpu"],
    ["compare", "{m}", "-t", "cpu", "-p", "int8"],
    ["profile", "{m}", "-t", "cpu", "--runs", "3"],
    ["optimize", "{m}", "--output", "{tmp}/out.onnx", "-t", "cpu"],
    ["doctor"],
    ["zoo", "list"],
], ids=lambda a: a[0] if a[0] != "zoo" else "zoo-list")
def test_main_tables_keep_every_number_whole_at_80_and_120_columns(args, mlp, tmp_path, catch):
    argv = [a.format(m=mlp, tmp=tmp_path) for a in args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert_numbers_whole(catch.tables)


def test_bench_table_at_80_columns_has_whole_headers_and_latencies(mlp, catch):
    result = runner.invoke(app, ["bench", str(mlp), "-t", "cpu", "-t", "cpu/int8", "--runs", "5", "--warmup", "1",
                                 "--no-telemetry"])
    assert result.exit_code == 0, result.output
    table, startup = catch.tables
    narrow = render(table, 80)
    assert "session" in render(startup, 80)
    header = next(line for line in narrow.splitlines() if line.strip()).split()
    assert header[:3] == ["target", "batch", "io"] and "p50" in header and "accuracy" in header
    assert "targe" not in header


def test_loadtest_table_keeps_headers_and_values_whole(catch):
    from onnxaccel.bench.stats import LatencyStats

    samples = [113.20145 + i for i in range(50)]
    levels = [LevelResult(c, 123456, {"503": 12} if c == 32 else {}, 10.0, 8, LatencyStats.from_ms(samples),
                          1.2345, 113.4567) for c in (1, 8, 32)]
    report = LoadtestReport(LoadtestConfig(url="http://127.0.0.1:8000", model="mlp"), {"name": "onnxaccel",
                            "version": "0.9"}, {"x": [8, 4]}, levels)
    loadtest._render(report, None)
    assert_numbers_whole(catch.tables)
    narrow = render(catch.tables[0], 80)
    assert "requ…" not in narrow and "…" not in narrow


def test_tune_candidates_table(mlp, tmp_path, catch):
    result = runner.invoke(app, ["tune", str(mlp), "-t", "cpu", "-b", "1,8", "--threads", "1,2", "--duration",
                                 "0.1", "--confirm-duration", "0.2", "--warmup", "2", "-o", str(tmp_path / "c.json")])
    assert result.exit_code == 0, result.output
    assert_numbers_whole(catch.tables)


def test_check_table(catch):
    from onnxaccel.conformance.onnx_suites import shipped_data_dir

    data = shipped_data_dir()
    result = runner.invoke(app, ["check", str(data / "simple" / "test_sign_model"),
                                 str(data / "pytorch-converted" / "test_Conv2d"), "-t", "cpu"])
    assert result.exit_code == 0, result.output
    assert_numbers_whole(catch.tables)


def test_monitor_live_and_summary_tables(catch, monkeypatch, tmp_path):
    from tests.system.tool_outputs import write_tool  # real rocm-smi output behind a stand-in rocm-smi

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    write_tool(bin_dir, "rocm-smi", "rocm_smi_7900xtx.json", "rocm_smi_7900xtx.json", "rocm_smi_7900xtx.json")
    live, table = [], monitor._table
    monkeypatch.setattr(monitor, "_table", lambda *args: live.append(table(*args)) or live[-1])
    result = runner.invoke(app, ["monitor", "--count", "2", "--interval", "0.05"])
    assert result.exit_code == 0, result.output
    assert live and catch.tables  # the live view and the summary
    assert_numbers_whole([live[-1], *catch.tables])


def test_cache_list_table(catch, monkeypatch, tmp_path):
    import time

    from onnxaccel.transform.compile_cache import CacheEntry

    key = {"model": "/models/a_model_with_a_rather_long_file_name.onnx", "target": "migraphx:0/fp16",
           "shapes": {"input_ids": [8, 128], "attention_mask": [8, 128]}, "runtime": {"onnxruntime": "1.32.0"}}
    entries = [CacheEntry(tmp_path / f"e{i}f3a9c1b2d4e5", key, 123_456_789 * (i + 1), 3, time.time() - 9000,
                          time.time() - 3600 * i, 312.5 + i, 1.25 + i, 17 * i) for i in range(3)]
    monkeypatch.setattr(cache, "listing", lambda: cache.CacheListing(str(tmp_path), entries))
    result = runner.invoke(app, ["cache", "list"])
    assert result.exit_code == 0, result.output
    assert_numbers_whole(catch.tables)


def test_progress_counts_show_a_total_only_where_it_is_known():
    from rich.progress import Progress

    progress = Progress(bench.CountColumn(), console=Console(file=io.StringIO()))
    cells = progress.add_task("cells", total=4)
    runs = progress.add_task("cpu|batch=1", total=None)  # a --duration cell before its first sample
    progress.advance(cells)
    column = bench.CountColumn()
    assert column.render(progress.tasks[cells]).plain == "1/4"
    assert column.render(progress.tasks[runs]).plain == "0"  # never "0/None"
