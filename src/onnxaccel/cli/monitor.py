"""`onnxaccel monitor`: a live view of every GPU's utilization, memory, power, temperature and clocks.

Exit status: 0 after --count readings (or Ctrl-C); 1 when this machine has no GPU that NVML, amdsmi or
rocm-smi can read (the message says why each was not usable), so a script never mistakes "nothing to
monitor" for "idle GPUs".
"""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING

import typer
from rich import box
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from onnxaccel.cli.tables import columns, new_table, number_column, text_column
from onnxaccel.install import install_command
from onnxaccel.cli.args_data import OutputArgs
from onnxaccel.cli.common import console, handle_errors
from onnxaccel.cli.compose import Built, Group, composed, option
from onnxaccel.errors import OnnxAccelError, UsageError
from onnxaccel.system.gpu_sample import GpuSample

if TYPE_CHECKING:  # the backends (ONNX Runtime for AMD's probe) are imported when the command runs
    from onnxaccel.system.telemetry import TelemetryRecorder, TelemetrySummary

SCHEMA = "onnxaccel.monitor/1"


class ReadingsArgs(Group):
    """--interval between readings (checked) and --count of readings (None: until Ctrl-C)."""

    PARAMS = (
        option("interval", float, 1.0, "--interval", help="Seconds between readings."),
        option("count", int | None, None, "--count", help="Stop after N readings (default: until Ctrl-C)."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        from onnxaccel.system.telemetry import check_interval

        check_interval(v.interval)
        if v.count is not None and v.count < 1:
            raise UsageError(f"--count must be at least 1, got {v.count}.", "Leave it out to run until Ctrl-C.")
        return v


def register(app: typer.Typer) -> None:
    """Add the ``monitor`` command to the application."""
    app.command("monitor", help="Live view of all GPUs (NVML for NVIDIA; amdsmi or rocm-smi for AMD). --json "
                "prints one JSON line per reading for scripts. Exits 1 when there is no GPU to monitor.")(
        monitor_command)


@handle_errors
@composed(ReadingsArgs(), OutputArgs())
def monitor_command(readings, as_json: bool) -> None:
    """Show live GPU readings until interrupted (or ``--count`` readings); exit 1 without a GPU."""
    from onnxaccel.system.telemetry import TelemetryRecorder
    from onnxaccel.system.telemetry_backends import open_backends

    interval, count = readings.interval, readings.count
    backends, notes = open_backends()
    if not backends:
        raise OnnxAccelError("No GPU to monitor: " + "; ".join(notes) + ".",
                             f"On an NVIDIA machine install the driver and `{install_command('nvidia')}`; on AMD "
                             "install ROCm (amdsmi or rocm-smi). `onnxaccel doctor` explains what is missing.")
    recorder = TelemetryRecorder(backends, interval, notes)
    try:
        if as_json:
            _json_lines(recorder, interval, count)
        else:
            _live(recorder, interval, count)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a monitor is stopped: not an error
    finally:
        for backend in backends:
            backend.close()
    if not as_json:
        console.print()
        _render_summary(recorder.summary())


def _readings(recorder: TelemetryRecorder, interval: float, count: int | None):
    start = next_at = time.perf_counter()
    taken = 0
    while count is None or taken < count:
        samples = recorder.read()
        taken += 1
        yield time.perf_counter() - start, samples
        if count is not None and taken >= count:
            return
        next_at += interval
        time.sleep(max(0.0, next_at - time.perf_counter()))


def _json_lines(recorder: TelemetryRecorder, interval: float, count: int | None) -> None:
    for elapsed, samples in _readings(recorder, interval, count):
        line = {"schema": SCHEMA, "t": round(elapsed, 3), "gpus": [s.to_dict() for s in samples]}
        if recorder.errors:
            line["errors"] = recorder.errors[-3:]
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


def _fmt(value: float | None, unit: str, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _table(samples: list[GpuSample], elapsed: float, backends: list[str]) -> Table:
    table = columns(new_table(f"GPUs ({', '.join(backends)}), {elapsed:.1f} s"),
                    ("GPU", "name", "util", "memory", "power", "temp", "gfx clock", "mem clock"),
                    numbers=("util", "memory", "power", "temp", "gfx clock", "mem clock"))
    for s in samples:
        memory = "-" if s.memory_used_bytes is None else \
            f"{s.memory_used_bytes / 2**30:.1f}/{_fmt(s.memory_total_bytes and s.memory_total_bytes / 2**30, '', 1)} GiB"
        table.add_row(f"{s.vendor} {s.gpu}", escape(s.name), _fmt(s.utilization_pct, " %"), memory, _fmt(s.power_w, " W", 1),
                      _fmt(s.temperature_c, " °C"), _fmt(s.gfx_clock_mhz, " MHz"), _fmt(s.mem_clock_mhz, " MHz"))
    return table


def _live(recorder: TelemetryRecorder, interval: float, count: int | None) -> None:
    names = [b.name for b in recorder.backends]
    with Live(console=console, auto_refresh=False, transient=False) as live:
        for elapsed, samples in _readings(recorder, interval, count):
            live.update(_table(samples, elapsed, names), refresh=True)


def _render_summary(summary: TelemetrySummary) -> None:
    table = Table(title=f"Summary: {summary.overhead.samples} readings in {summary.duration_s:.1f} s "
                  f"(sampler: {summary.overhead.thread_cpu_ms + summary.overhead.child_cpu_ms:.1f} ms CPU per reading)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    text_column(table, "GPU")
    for column in ("util mean/peak", "memory peak", "power mean/peak", "temp peak"):
        number_column(table, column)
    for gpu in summary.gpus:
        m = gpu.metrics
        peak_mem = m["memory_used_bytes"].peak
        table.add_row(escape(f"{gpu.vendor} {gpu.gpu} {gpu.name}"),
                      f"{_fmt(m['utilization_pct'].mean, '')}/{_fmt(m['utilization_pct'].peak, ' %')}",
                      "-" if peak_mem is None else f"{peak_mem / 2**30:.2f} GiB",
                      f"{_fmt(m['power_w'].mean, '', 1)}/{_fmt(m['power_w'].peak, ' W', 1)}",
                      _fmt(m["temperature_c"].peak, " °C"))
    console.print(table)
    for error in summary.errors:
        console.print(f"[yellow]warning:[/] {escape(error)}", highlight=False)
