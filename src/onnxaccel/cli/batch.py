"""`onnxaccel batch`: offline inference over a dataset, in-process or on a Ray cluster, with resume.

Exit status: 0 every input row was computed; 3 the job completed but some inputs could not be read
(``--on-error skip``: they are listed in the report, ``--json`` ``errors``, and the manifest); 2 bad usage or
input (``--on-error stop`` stopping at a bad file included); 1 any other failure.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from onnxaccel import startup
from onnxaccel.cli.args_data import RUN_IMAGE_HELP, OutputArgs, PreprocessArgs
from onnxaccel.cli.args_model import ConfigArgs, ShapeArgs, SourceArg, TargetArgs
from onnxaccel.cli.common import console, err_console, handle_errors, note, print_json, warn
from onnxaccel.cli.compose import REQUIRED, Built, Group, composed, option
from onnxaccel.engines import prewarm
from onnxaccel.errors import ModelError, UsageError

#: Exit status of a job that completed with bad inputs recorded as errors (distinct from 1 and 2, which mean
#: the job itself failed).
EXIT_WITH_ERRORS = 3
#: The order of the options in --help.
ORDER = ("model input output target precision ep_option config ray batch workers cpus_per_worker shape column "
         "id_column images_per_shard overwrite shape_buckets on_error embed_preprocess preprocess mean std resize "
         "layout bgr decoder as_json")


class DatasetArgs(Group):
    """The dataset and where its results go: --input, --output, --column, --id-column, --images-per-shard,
    --overwrite, --on-error, --decoder. Builds their values (--column as INPUT -> COLUMN)."""

    PARAMS = (
        option("input", str, REQUIRED, "--input", "-i", help="A folder of images, .npy/.npz files or .parquet files, "
               "or one .parquet/.npy/.npz file. Each file (or each run of --images-per-shard images) is a shard."),
        option("output", Path, REQUIRED, "--output", "-o", help="Output folder: NAME.parquet per input shard and "
               "_manifest.json (finished shards, for resume)."),
        option("column", list[str] | None, None, "--column", help="INPUT=COLUMN: the parquet column (or npz array) "
               "feeding a model input; default: the input's own name. Repeatable."),
        option("id_column", str | None, None, "--id-column", help="A parquet column whose values are the row ids "
               "(default: FILE:ROW)."),
        option("images_per_shard", int, 1024, "--images-per-shard", help="Images per output shard."),
        option("overwrite", bool, False, "--overwrite", help="Discard results of a different job in --output "
               "instead of refusing."),
        option("on_error", str, "skip", "--on-error", help="skip: an input that cannot be read becomes an error row "
               "(file, reason) in the report and the manifest, the job goes on and exits with status 3; a rerun "
               "after fixing or removing it computes just its shard. stop: stop at the first bad input (finished "
               "shards are kept; the rerun resumes)."),
        option("decoder", str, "auto", "--decoder", help="Image decoder for models fed uint8 pixels: auto (on CUDA "
               "targets nvJPEG through DALI, nvImageCodec or torchvision, the first installed; else a CPU process "
               "pool), nvjpeg, dali, nvimgcodec, torchvision (nvJPEG through that library), hybrid (nvJPEG and the "
               "CPU pool together, each unit split by their rates), cpu-pool, cpu."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        return SimpleNamespace(**{**vars(v), "column": _columns(v.column or [])})


class RayDataArgs(Group):
    """Running on Ray Data: --ray (None: in-process), --workers, --cpus-per-worker."""

    PARAMS = (
        option("ray", str | None, None, "--ray", help="Run on Ray Data: auto (RAY_ADDRESS, a cluster running here, "
               "else a new local one), local, or the cluster's ADDRESS (HOST:PORT or ray://HOST:10001)."),
        option("workers", int | None, None, "--workers", help="Ray actors (default: one per GPU of the cluster; on "
               "a CPU target one per --cpus-per-worker CPUs)."),
        option("cpus_per_worker", float, 1.0, "--cpus-per-worker", help="CPUs each CPU-target actor reserves (and "
               "its ONNX Runtime threads)."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        return v


def register(app: typer.Typer) -> None:
    """Add `batch` to the `onnxaccel` app."""
    app.command("batch", help="Offline inference over a dataset (a folder of images, .npy/.npz shards, or parquet "
                "files): one parquet output file per input shard, resumable (finished shards are skipped), a "
                "throughput report at the end. In-process by default; --ray runs it on Ray Data, one actor per GPU, "
                "across the nodes of a Ray cluster.")(batch_command)


@handle_errors
@composed(
    SourceArg("An .onnx file or a built-in zoo:NAME."), DatasetArgs(), TargetArgs(config=True),
    ConfigArgs("target, batch, shapes and shape buckets"), RayDataArgs(),
    ShapeArgs(batch=option("batch", int | None, None, "--batch", "-b", help="Rows per model call (default: the "
                           "--config's batch, else 8 on CPU, 32 on GPUs)."),
              buckets="Pad rows to the smallest of these sizes that fits, outputs cropped back (.npy/.npz shards, "
              "one length per shard): DIM=SIZES (sequence=32,64,128), DIM,DIM=SIZES, or INPUT:AXIS=SIZES."),
    PreprocessArgs(embed=("imagenet, yolo or scale01: run a cached copy of the model with this preprocessing "
                          "embedded (it takes uint8 NHWC pixels; cast, scale, mean/std and transpose run in the "
                          "graph), images decoded at reduced size by a pool of processes. Default: on GPU targets, "
                          "images given --preprocess imagenet|yolo|scale01 get it embedded; none: never. A model "
                          "with preprocessing embedded already is fed pixels without this flag; --mean, --std, "
                          "--resize or --bgr keep the preprocessing on the host.", None), image=RUN_IMAGE_HELP),
    OutputArgs(), order=ORDER,
)
def batch_command(model, data, target, tuned, ray, shapes, preprocess, as_json) -> None:
    """Run MODEL over a dataset; options a --config can set resolve as flag > config > default (cli/groups.py)."""
    prewarm.start(target)  # a GPU provider's libraries load while the command imports and reads the model
    with startup.stage("import", detail="the command's modules (onnx, numpy)"):  # deferred from start-up
        from onnxaccel.scale import run_batch  # heavy: loaded per command (keeps --help fast)

    job = _job(model, data, target, ray, shapes, preprocess)
    with _Bar(disable=as_json) as bar:
        report = run_batch(job, progress=bar.update)
    if as_json:
        data = report.to_dict()
        reason = next((c["reason"] for c in (report.plan or {}).get("choices", ()) if c["name"] == "embed_preprocess"),
                      "")
        print_json({**data, "embedded_automatically": bool(report.embedded) and reason.startswith("GPU target")})
    else:
        _render(report)
    if report.errors:
        raise typer.Exit(EXIT_WITH_ERRORS)


def _job(model: str, data, target, ray, shapes, preprocess):
    """The BatchJob the command line asks for. Whether to embed the preprocessing is the job's plan's decision
    (plan.py embed_preset, made in run_batch as for a Python caller); the report says what was chosen and why."""
    from onnxaccel.scale import BatchJob

    job = BatchJob(model=model, input=data.input, output=str(data.output), target=target,
                   batch=shapes.batch, shapes=shapes.shapes, columns=data.column, id_column=data.id_column,
                   images_per_shard=data.images_per_shard, ray=ray.ray, workers=ray.workers,
                   cpus_per_worker=ray.cpus_per_worker, overwrite=data.overwrite, on_error=data.on_error,
                   shape_buckets=shapes.buckets, decoder=data.decoder, preprocess=preprocess.request,
                   embed_preprocess=preprocess.embed or "auto")
    return job


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
    buckets = f", shape buckets {escape(report.shape_buckets)}" if report.shape_buckets else ""
    console.print(f"[bold]{escape(report.model)}[/] on [bold]{escape(report.target)}[/], {where}, batch {report.batch}"
                  f"{buckets}")
    console.print(f"input {escape(str(report.input['path']))}: {report.input['kind']}, {report.shards_total} shard(s), "
                  f"{report.rows_total} rows")
    if report.shapes:
        from onnxaccel.scale.shape_groups import describe_ran

        console.print("shapes: " + "; ".join(describe_ran(entry) for entry in report.shapes), markup=False,
                      highlight=False)
    if report.shards_skipped:
        note(f"{report.shards_skipped} shard(s) ({report.rows_skipped} rows) were finished before and skipped.")
    failed = f" ({report.rows_failed} unreadable row(s) left out)" if report.rows_failed else ""
    console.print(f"wrote {report.shards_done} shard(s), {report.rows_done} rows to {escape(report.output)}{failed}")
    console.print(f"[bold]{d['rows_per_s']:.1f} rows/s[/] once running ({d['rows_per_s_wall']:.1f} rows/s over "
                  f"{report.wall_s:.1f} s, of which {report.startup_s:.1f} s startup and {report.shutdown_s:.1f} s "
                  f"shutdown)")
    if report.startup:
        from onnxaccel.startup import Startup

        console.print(Startup.from_dict(report.startup).line(), markup=False, highlight=False)
    if report.preprocess and not report.embedded:
        pre = report.preprocess
        note(f"images preprocessed on the host: {pre['preset']} ({pre['origin'] or 'as asked'})")
    if report.embedded:
        note(f"preprocessing embedded in the model ({report.embedded['preset']}): fed uint8 NHWC pixels")
    _render_stages(report.stages)
    _render_errors(report.errors)
    if report.workers:
        table = Table(title="workers", title_justify="left")
        for col in ("worker", "units", "rows", "read s", "run s", "rows/run-s"):
            table.add_column(col, justify="left" if col == "worker" else "right")
        for w in report.workers:
            rate = f"{w.rows / w.run_s:.0f}" if w.run_s else "-"
            table.add_row(escape(w.name), str(w.units), str(w.rows), f"{w.read_s:.2f}", f"{w.run_s:.2f}", rate)
        console.print(table)


#: What each pipeline stage means, for the breakdown table (scale/stages.py StageTimes).
_STAGE_TEXT = {"read": "reading and casting rows", "decode": "decoding images (share of all decoding processes)",
               "wait_for_device": "input ready, waiting for the model", "starved": "model waiting for input",
               "run": "model runs (copies in and out included)", "write": "parquet and manifest writes"}


def _render_stages(stages: dict | None) -> None:
    """The pipeline's time per stage and share of wall, and the stage that limits the job."""
    if not stages:
        return
    table = Table(title=f"pipeline stages over {stages['wall_s']:.2f} s", title_justify="left")
    for col in ("stage", "s", "% of wall", "what"):
        table.add_column(col, justify="left" if col in ("stage", "what") else "right")
    for name, value in stages["stages"].items():
        table.add_row(name, f"{value['s']:.2f}", f"{value['pct_of_wall']:.0f}", _STAGE_TEXT[name])
    console.print(table)
    if stages.get("decoder"):
        note(f"decoder: {stages['decoder']} ({escape(stages['decoder_reason'])})")
    if stages.get("run_instances", 1) > 1:
        note(f"{stages['run_instances']} GPU sessions ran units at once (one copies in while another runs); the run "
             "share is over sessions x wall")
    if stages.get("host_copies"):
        note(f"copies to the device: {escape(stages['host_copies'])}")
    for line in stages.get("notes", []):
        note(escape(line))
    console.print(f"bottleneck: [bold]{stages['bottleneck']}[/]")


def _render_errors(errors: list[dict], shown: int = 20) -> None:
    """The bad inputs (first ``shown``), and what to do about them."""
    if not errors:
        return
    warn(f"completed with {len(errors)} error(s): these inputs could not be read and have no output rows")
    table = Table(title="errors", title_justify="left")
    for col in ("shard", "file", "stage", "rows", "reason"):
        table.add_column(col, justify="right" if col == "rows" else "left", overflow="fold")
    for e in errors[:shown]:
        table.add_row(escape(e["shard"]), escape(e["file"]), e["stage"], str(e["rows"]), escape(e["reason"]))
    err_console.print(table)
    if len(errors) > shown:
        note(f"... and {len(errors) - shown} more (--json lists them all; so does _manifest.json).")
    note("Fix or remove these files and rerun the same command: only their shards are computed again.")
