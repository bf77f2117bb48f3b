"""`onnxaccel bench`: latency and throughput of a model on a target."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.markup import escape
from rich.table import Table

from onnxaccel.bench.timing import measure
from onnxaccel.cli.common import (
    BatchOpt, EpOptionOpt, JsonOpt, PrecisionOpt, ShapeOpt, StrictOpt, TargetOpt, console, err_console,
    handle_errors, note, print_json, resolve_target, warn,
)
from onnxaccel.model import parse_shape_bindings
from onnxaccel.pipeline import prepare

SCHEMA = "onnxaccel.bench/1"


def register(app: typer.Typer) -> None:
    app.command("bench", help="Measure latency (min/mean/p50...p99.9/max) and throughput of a model on a "
                "target; session creation and the first run are reported apart.")(bench_command)


@handle_errors
def bench_command(
    model: Annotated[str, typer.Argument(help="An .onnx file or zoo:NAME.")],
    target: TargetOpt = "auto",
    precision: PrecisionOpt = None,
    ep_option: EpOptionOpt = None,
    shape: ShapeOpt = None,
    batch: BatchOpt = None,
    warmup: Annotated[int, typer.Option(help="Untimed runs before measuring.")] = 10,
    runs: Annotated[int, typer.Option(help="Timed runs.")] = 100,
    iobinding: Annotated[bool, typer.Option("--iobinding/--no-iobinding", help="Device-resident inputs and "
                         "outputs (IO binding) or numpy in/out.")] = True,
    strict: StrictOpt = False,
    as_json: JsonOpt = False,
) -> None:
    tgt = resolve_target(target, precision, ep_option)
    prepared = prepare(model, tgt, shapes=parse_shape_bindings(shape or []), batch=batch, strict=strict)
    batch_size = next(iter(prepared.model.input_shapes.values()))[0] if prepared.model.input_shapes else 1
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err_console, transient=True, disable=as_json) as bar:
        task = bar.add_task(f"{model} on {tgt}", total=runs)
        timing = measure(prepared.runner, prepared.feeds, batch=batch_size, warmup=warmup, runs=runs,
                         iobinding=iobinding, progress=lambda n, _: bar.update(task, completed=n))
    result = {
        "schema": SCHEMA, "model": model, "target": str(tgt), "providers": prepared.runner.providers,
        "input_shapes": {k: list(v) for k, v in prepared.model.input_shapes.items()},
        "compile_seconds": prepared.runner.compile_seconds, "placement": prepared.runner.placement.to_dict(),
        "warnings": prepared.warnings, **timing.to_dict(),
    }
    if as_json:
        print_json(result)
        return
    for message in prepared.warnings:
        (warn if "fall" in message or "took" in message else note)(message)
    lat = timing.latency
    console.print(f"[bold]{escape(model)}[/] on [bold]{escape(str(tgt))}[/] ({prepared.runner.providers[0]}), batch {batch_size}, "
                  f"{'IO binding' if iobinding else 'numpy in/out'}")
    console.print(f"placement: {prepared.runner.placement.summary()}", markup=False)
    table = Table(title_justify="left")
    for col in ("session", "first run", "min", "mean", "p50", "p90", "p99", "max", "throughput"):
        table.add_column(col, justify="right")
    table.add_row(f"{prepared.runner.compile_seconds * 1e3:.0f} ms", f"{timing.first_run_ms:.2f} ms",
                  f"{lat.min:.3f} ms", f"{lat.mean:.3f} ms", f"{lat.p50:.3f} ms", f"{lat.p90:.3f} ms",
                  f"{lat.p99:.3f} ms", f"{lat.max:.3f} ms", f"{timing.throughput:,.1f} items/s")
    console.print(table)
    if lat.unstable:
        warn(f"unstable measurement: coefficient of variation {lat.cv:.0%} (> 10%); the machine may be busy, "
             "or use more --runs.")
