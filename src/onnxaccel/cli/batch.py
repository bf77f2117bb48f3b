"""`onnxaccel batch`: offline inference over a dataset, in-process or on a Ray cluster, with resume."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from onnxaccel.cli.common import (
    EpOptionOpt, JsonOpt, PrecisionOpt, ShapeOpt, console, err_console, handle_errors, note, print_json, warn,
)
from onnxaccel.cli.groups import ModelArgs, TargetOpt, build_target, config_option, load_tuned
from onnxaccel.errors import UsageError

ConfigOpt = config_option("target, batch and shapes")


def register(app: typer.Typer) -> None:
    """Add `batch` to the `onnxaccel` app."""
    app.command("batch", help="Offline inference over a dataset (a folder of images, .npy/.npz shards, or parquet "
                "files): one parquet output file per input shard, resumable (finished shards are skipped), a "
                "throughput report at the end. In-process by default; --ray runs it on Ray Data, one actor per GPU, "
                "across the nodes of a Ray cluster.")(batch_command)


@handle_errors
def batch_command(
    model: Annotated[str, typer.Argument(help="An .onnx file or a built-in zoo:NAME.")],
    input: Annotated[str, typer.Option("--input", "-i", help="A folder of images, .npy/.npz files or .parquet files, "
                     "or one .parquet/.npy/.npz file. Each file (or each run of --images-per-shard images) is a "
                     "shard.")],
    output: Annotated[Path, typer.Option("--output", "-O", help="Output folder: NAME.parquet per input shard and "
                      "_manifest.json (finished shards, for resume).")],
    target: TargetOpt = None,
    precision: PrecisionOpt = None,
    ep_option: EpOptionOpt = None,
    config: ConfigOpt = None,
    ray: Annotated[str | None, typer.Option("--ray", help="Run on Ray Data: auto (RAY_ADDRESS, a cluster running "
                   "here, else a new local one), local, or the cluster's ADDRESS (HOST:PORT or "
                   "ray://HOST:10001).")] = None,
    batch: Annotated[int | None, typer.Option("--batch", "-b", help="Rows per model call (default: the --config's "
                     "batch, else 8 on CPU, 32 on GPUs).")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="Ray actors (default: one per GPU of the "
                       "cluster; on a CPU target one per --cpus-per-worker CPUs).")] = None,
    cpus_per_worker: Annotated[float, typer.Option("--cpus-per-worker", help="CPUs each CPU-target actor "
                               "reserves (and its ONNX Runtime threads).")] = 1.0,
    shape: ShapeOpt = None,
    column: Annotated[list[str] | None, typer.Option("--column", help="INPUT=COLUMN: the parquet column (or npz "
                      "array) feeding a model input; default: the input's own name. Repeatable.")] = None,
    id_column: Annotated[str | None, typer.Option("--id-column", help="A parquet column whose values are the row "
                         "ids (default: FILE:ROW).")] = None,
    images_per_shard: Annotated[int, typer.Option("--images-per-shard", help="Images per output shard.")] = 1024,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Discard results of a different job in --output "
                         "instead of refusing.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run MODEL over a dataset; options a --config can set resolve as flag > config > default (cli/groups.py)."""
    from onnxaccel.scale import BatchJob, run_batch  # heavy: loaded per command (keeps --help fast)

    tuned = load_tuned(config)
    tgt = build_target(target, precision, ep_option, tuned)
    bound = ModelArgs.resolve(model, shape=shape, batch=batch, tuned=tuned)
    job = BatchJob(model=model, input=input, output=str(output), target=tgt,
                   batch=bound.batch, shapes=bound.shapes, columns=_columns(column or []),
                   id_column=id_column, images_per_shard=images_per_shard, ray=ray, workers=workers,
                   cpus_per_worker=cpus_per_worker, overwrite=overwrite)
    with _Bar(disable=as_json) as bar:
        report = run_batch(job, progress=bar.update)
    if as_json:
        print_json(report.to_dict())
        return
    _render(report)


def _columns(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, column = item.partition("=")
        if not sep or not name or not column:
            raise UsageError(f"Cannot read --column '{item}'.",
                             "Write --column INPUT=COLUMN, e.g. --column data=pixels.")
        out[name] = column
    return out


class _Bar:
    """A Rich progress bar over rows, on stderr; off for --json and when stderr is not a terminal."""

    def __init__(self, disable: bool):
        self.progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("rows, {task.fields[shards]} shards"),
                                 TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=True,
                                 disable=disable or not err_console.is_terminal)
        self.task = None

    def __enter__(self) -> _Bar:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def update(self, p) -> None:
        """Show the rows and shards done so far (a run_batch progress callback)."""
        shards = f"{p.shards_done}/{p.shards_total}"
        if self.task is None:
            self.task = self.progress.add_task("batch", total=p.rows_total, completed=p.rows_done, shards=shards)
        else:
            self.progress.update(self.task, completed=p.rows_done, shards=shards)


def _render(report) -> None:
    for message in report.warnings:
        warn(message)
    d = report.to_dict()
    where = "in-process"
    if report.ray:
        cluster, pool = report.ray["cluster"], report.ray["pool"]
        where = (f"Ray at {cluster['address']} ({cluster['nodes']} node(s), {cluster['cpus']:g} CPUs, "
                 f"{cluster['gpus']:g} GPUs), {pool['workers']} actor(s)")
    console.print(f"[bold]{escape(report.model)}[/] on [bold]{escape(report.target)}[/], {where}, batch {report.batch}")
    console.print(f"input {escape(str(report.input['path']))}: {report.input['kind']}, {report.shards_total} shard(s), "
                  f"{report.rows_total} rows")
    if report.shards_skipped:
        note(f"{report.shards_skipped} shard(s) ({report.rows_skipped} rows) were finished before and skipped.")
    console.print(f"wrote {report.shards_done} shard(s), {report.rows_done} rows to {escape(report.output)}")
    console.print(f"[bold]{d['rows_per_s']:.1f} rows/s[/] once running ({d['rows_per_s_wall']:.1f} rows/s over "
                  f"{report.wall_s:.1f} s, of which {report.startup_s:.1f} s startup)")
    if report.workers:
        table = Table(title="workers", title_justify="left")
        for col in ("worker", "units", "rows", "read s", "run s", "rows/run-s"):
            table.add_column(col, justify="left" if col == "worker" else "right")
        for w in report.workers:
            rate = f"{w.rows / w.run_s:.0f}" if w.run_s else "-"
            table.add_row(escape(w.name), str(w.units), str(w.rows), f"{w.read_s:.2f}", f"{w.run_s:.2f}", rate)
        console.print(table)
