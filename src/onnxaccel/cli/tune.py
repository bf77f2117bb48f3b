"""`onnxaccel tune`: search precision, IO binding, layout, graph capture, provider options, threads and batch
for the fastest configuration inside the accuracy gate; write it as a configuration file."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from onnxaccel.bench.config import save_config
from onnxaccel.bench.report import clean
from onnxaccel.cli.bench import SweepProgress
from onnxaccel.cli.common import (
    EpOptionOpt,
    InputOpt,
    JsonOpt,
    ShapeOpt,
    StrictOpt,
    TargetOpt,
    console,
    handle_errors,
    note,
)
from onnxaccel.cli.groups import (
    AtolOpt,
    BatchesOpt,
    GpuOpt,
    InputArgs,
    MaxErrorOpt,
    ModelArgs,
    ReportArgs,
    ReportOpt,
    RtolOpt,
    SeedOpt,
    build_target,
    check_positive,
    ints,
)
from onnxaccel.cli.tables import columns, new_table, si
from onnxaccel.errors import UsageError
from onnxaccel.target import PRECISIONS


def register(app: typer.Typer) -> None:
    """Add `tune` to the `onnxaccel` app."""
    app.command("tune", help="Find the fastest configuration of a model on a target: precision, IO binding, NHWC "
                "layout, graph capture, provider options (cuDNN/MIOpen algorithm search, MIGraphX exhaustive tune), "
                "CPU threads and batch; only configurations inside the accuracy gate count. Writes a configuration "
                "file that `run`, `bench` and `serve` accept (--config).")(tune_command)


@handle_errors
def tune_command(
    model: Annotated[str, typer.Argument(help="An .onnx file or zoo:NAME.")],
    target: TargetOpt = "auto",
    ep_option: EpOptionOpt = None,
    precision: Annotated[str | None, typer.Option("--precision", "-p", help="Only these precisions, comma-separated "
                         "(default: those the device runs well: cpu fp32,int8; cuda/rocm fp32,fp16; migraphx and "
                         "tensorrt fp32,fp16,int8).")] = None,
    batch: BatchesOpt = None,
    shape: ShapeOpt = None,
    max_error: MaxErrorOpt = None,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    latency_budget: Annotated[float | None, typer.Option("--latency-budget", help="Milliseconds: the best throughput "
                              "whose p99 latency stays within this budget (default: the best throughput).")] = None,
    duration: Annotated[float, typer.Option(help="Seconds of timed calls per candidate.")] = 1.0,
    confirm_duration: Annotated[float, typer.Option(help="Seconds for the final side-by-side measurement of the "
                                "winner and the plain baseline.")] = 3.0,
    warmup: Annotated[int, typer.Option(help="Untimed runs per candidate (the first includes lazy compilation).")] = 10,
    time_budget: Annotated[float | None, typer.Option("--time-budget", help="Seconds; stop starting new search "
                           "stages after this (the best so far wins).")] = None,
    threads: Annotated[str | None, typer.Option(help="CPU: intra-op thread counts to try, e.g. 1,4,8 (default: all "
                       "logical CPUs, half of them, and 1).")] = None,
    instances: Annotated[str | None, typer.Option(help="Session counts to try side by side once the options are "
                         "chosen (throughput from several streams, as Triton's instance count). Default: 2,4 on "
                         "GPUs, none on CPUs; 1 turns the stage off.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Configuration file to write (default: "
                      "MODELNAME-tuned.json).")] = None,
    report: ReportOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Reuse the candidates already measured in the first "
                      "--report FILE.json (default report: OUTPUT with .report.json).")] = False,
    inputs: InputOpt = None,
    seed: SeedOpt = 0,
    gpu: GpuOpt = None,
    shape_buckets: Annotated[str | None, typer.Option("--shape-buckets", help="Shape buckets to record in the "
                             "configuration (`shape_buckets`), used by bench and batch --config, e.g. "
                             "sequence=32,64,128,256; tuned at the --shape size.")] = None,
    strict: StrictOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Search MODEL's fastest configuration on a target and write it (a `tune` reads no --config)."""
    from onnxaccel.bench.accuracy import AccuracyGate  # heavy: loaded per command (keeps --help fast)
    from onnxaccel.bench.tune import TuneSettings, tune

    tgt = build_target(target, None, ep_option, None)
    bound = ModelArgs.resolve(model, shape=shape, batch=batch, tuned=None)
    precisions = None
    if precision:
        precisions = tuple(dict.fromkeys(p.strip().lower() for p in precision.split(",") if p.strip()))
        bad = [p for p in precisions if p not in PRECISIONS]
        if bad or not precisions:
            raise UsageError(f"Unknown precision(s): {', '.join(bad) or precision}.",
                             f"Use a comma-separated list of {', '.join(PRECISIONS)}.")
    check_positive("--duration", duration)
    check_positive("--confirm-duration", confirm_duration)
    if latency_budget is not None and not latency_budget > 0:
        raise UsageError(f"--latency-budget must be positive milliseconds, got {latency_budget}.",
                         "e.g. --latency-budget 10")
    output = (output or Path(f"{_stem(model)}-tuned.json")).expanduser()
    if "=" in output.name:  # `tune -o KEY=VALUE` meant --ep-option until -o became --output (issue 23)
        raise UsageError(f"--output {output} looks like a provider option, not a file.",
                         f"-o is --output now; give provider options as --ep-option {output.name}.")
    if output.suffix.lower() != ".json":
        raise UsageError(f"--output {output} must be a .json file.", f"e.g. --output {output.with_suffix('.json')}")
    reports = ReportArgs.resolve(report, resume=resume, default_json=output.with_suffix(".report.json"))
    paths, previous = list(reports.paths), reports.previous()
    given = InputArgs.resolve(inputs, seed=seed)
    settings = TuneSettings(
        batches=bound.batches, shapes=bound.shapes,
        precisions=precisions, gate=AccuracyGate(max_error, atol, rtol), latency_budget_ms=latency_budget,
        warmup=warmup, duration=duration, confirm_duration=confirm_duration, time_budget_s=time_budget,
        threads=tuple(ints(threads, "--threads")) if threads else None, seed=given.seed, inputs=given.items,
        strict=strict, gpu_name=gpu,
        instances=tuple(n for n in ints(instances, "--instances") if n > 1) if instances else None,
        shape_buckets=_bucket_text(shape_buckets),
    )
    command = "onnxaccel tune " + shlex.join([model, "--target", str(tgt)] + _flags(
        batch=batch, shape=shape, precision=precision, max_error=max_error, latency_budget=latency_budget))
    with SweepProgress(disable=as_json) as progress:
        result = tune(model, tgt, settings, report_paths=paths, report=previous, on_event=progress.event,
                      command=command)
    save_config(result.config, output)
    if as_json:
        sys.stdout.write(json.dumps(clean({"config": str(output), "report": [str(p) for p in paths],
                                           **result.to_dict()}), indent=2) + "\n")
        return
    _render(result, output, paths)


def _render(result, output: Path, paths: list[Path]) -> None:
    table = columns(new_table("candidates"), ("stage", "configuration", "items/s", "p50 ms", "p99 ms", "verdict"),
                    numbers=("items/s", "p50 ms", "p99 ms"))
    for row in result.candidates:
        table.add_row(escape(row["stage"]), escape(row["id"]), si(row["throughput"]) if row["throughput"] else "-",
                      f"{row['p50_ms']:.3f}" if row["p50_ms"] is not None else "-",
                      f"{row['p99_ms']:.3f}" if row["p99_ms"] is not None else "-", escape(row["verdict"]),
                      style=None if row["verdict"] == "valid" else "dim")
    console.print(table)
    for line in result.summary():
        console.print(escape(line))
    config = result.config
    console.print(f"configuration written to [bold]{escape(str(output))}[/]; every candidate in "
                  f"{escape(', '.join(str(p) for p in paths))}")
    console.print(f"use it: onnxaccel bench --config {escape(shlex.quote(str(output)))}   or   onnxaccel run "
                  f"{escape(shlex.quote(config.model))} {escape(shlex.join(config.cli_args()))}", highlight=False)
    if config.target.device == "cpu" and result.speedup is not None and result.speedup < 1.05:
        note("the plain session is already about as fast as it gets here.")


def _flags(**values) -> list[str]:
    out = []
    for key, value in values.items():
        if value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            out += [f"--{key.replace('_', '-')}", str(item)]
    return out


def _bucket_text(spec: str | None) -> str | None:
    """--shape-buckets checked now (before minutes of tuning), in its canonical form."""
    if not spec:
        return None
    from onnxaccel.engines.buckets import ShapeBuckets
    return ShapeBuckets.parse(spec).describe()


def _stem(model: str) -> str:
    name = model[4:] if model.startswith("zoo:") else Path(model).stem
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "model"
