"""`onnxaccel tune`: search precision, IO binding, layout, graph capture, provider options, threads and batch
for the fastest configuration inside the accuracy gate; write it as a configuration file."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import typer
from rich.markup import escape

from onnxaccel.cli.args_data import GPU, AccuracyArgs, InputArgs, OutputArgs, ReportArgs, RunnerArgs
from onnxaccel.cli.args_model import BATCHES, PrecisionsArgs, ShapeArgs, SourceArg, TargetArgs
from onnxaccel.cli.bench import SweepProgress
from onnxaccel.cli.common import console, handle_errors, note
from onnxaccel.cli.compose import Built, Group, composed, option
from onnxaccel.cli.groups import check_positive, ints
from onnxaccel.cli.tables import columns, new_table, si
from onnxaccel.errors import UsageError
from onnxaccel.target import PRECISIONS

#: The order of the options in --help.
ORDER = ("model target ep_option precision batch shape max_error atol rtol latency_budget duration confirm_duration "
         "warmup time_budget threads instances output report resume inputs seed gpu shape_buckets strict as_json")


class SearchArgs(Group):
    """How `tune` searches: --latency-budget, --duration, --confirm-duration, --warmup, --time-budget, --threads,
    --instances, --gpu, all checked, with the --precision list checked against the known precisions. Builds
    their values and ``flags``: the search's options as `tune` flags, for the command line it records."""

    PARAMS = (
        option("latency_budget", float | None, None, "--latency-budget", help="Milliseconds: the best throughput "
               "whose p99 latency stays within this budget (default: the best throughput)."),
        option("duration", float, 1.0, help="Seconds of timed calls per candidate."),
        option("confirm_duration", float, 3.0, help="Seconds for the final side-by-side measurement of the winner "
               "and the plain baseline."),
        option("warmup", int, 10, help="Untimed runs per candidate (the first includes lazy compilation)."),
        option("time_budget", float | None, None, "--time-budget", help="Seconds; stop starting new search stages "
               "after this (the best so far wins)."),
        option("threads", str | None, None, help="CPU: intra-op thread counts to try, e.g. 1,4,8 (default: all "
               "logical CPUs, half of them, and 1)."),
        option("instances", str | None, None, help="Session counts to try side by side once the options are chosen "
               "(throughput from several streams, as Triton's instance count). Default: 2,4 on GPUs, none on CPUs; "
               "1 turns the stage off."),
        GPU,
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        precisions = ctx[PrecisionsArgs]
        names = None
        if precisions.text:
            names = tuple(dict.fromkeys(precisions.names))
            bad = [p for p in names if p not in PRECISIONS]
            if bad or not names:
                raise UsageError(f"Unknown precision(s): {', '.join(bad) or precisions.text}.",
                                 f"Use a comma-separated list of {', '.join(PRECISIONS)}.")
        check_positive("--duration", v.duration)
        check_positive("--confirm-duration", v.confirm_duration)
        if v.latency_budget is not None and not v.latency_budget > 0:
            raise UsageError(f"--latency-budget must be positive milliseconds, got {v.latency_budget}.",
                             "e.g. --latency-budget 10")
        flags = _flags(batch=ctx.given("batch"), shape=ctx.given("shape"), precision=precisions.text,
                       max_error=ctx.given("max_error"), latency_budget=v.latency_budget)
        return SimpleNamespace(**{**vars(v), "precisions": names, "flags": flags,
                                  "threads": tuple(ints(v.threads, "--threads")) if v.threads else None,
                                  "instances": tuple(n for n in ints(v.instances, "--instances") if n > 1)
                                  if v.instances else None})


class ConfigFileArgs(Group):
    """--output: the configuration file to write (default MODELNAME-tuned.json; a .json file). Builds its path."""

    PARAMS = (option("output", Path | None, None, "--output", "-o", help="Configuration file to write (default: "
                     "MODELNAME-tuned.json)."),)

    def build(self, v: SimpleNamespace, ctx: Built) -> Path:
        """The object the class docstring names, from the options' values."""
        output = (v.output or Path(f"{_stem(ctx[SourceArg])}-tuned.json")).expanduser()
        if "=" in output.name:  # `tune -o KEY=VALUE` meant --ep-option before -o became --output
            raise UsageError(f"--output {output} looks like a provider option, not a file.",
                             f"-o is --output now; give provider options as --ep-option {output.name}.")
        if output.suffix.lower() != ".json":
            raise UsageError(f"--output {output} must be a .json file.",
                             f"e.g. --output {output.with_suffix('.json')}")
        return output


def register(app: typer.Typer) -> None:
    """Add `tune` to the `onnxaccel` app."""
    app.command("tune", help="Find the fastest configuration of a model on a target: precision, IO binding, NHWC "
                "layout, graph capture, provider options (cuDNN/MIOpen algorithm search, MIGraphX exhaustive tune), "
                "CPU threads and batch; only configurations inside the accuracy gate count. Writes a configuration "
                "file that `run`, `bench` and `serve` accept (--config).")(tune_command)


@handle_errors
@composed(
    SourceArg("An .onnx file or zoo:NAME."), TargetArgs(precision=None),
    PrecisionsArgs("Only these precisions, comma-separated (default: those the device runs well: cpu fp32,int8; "
                   "cuda/rocm fp32,fp16; migraphx and tensorrt fp32,fp16,int8)."),
    ShapeArgs(batch=BATCHES, buckets="Shape buckets to record in the configuration (`shape_buckets`), used by bench "
              "and batch --config, e.g. sequence=32,64,128,256; tuned at the --shape size."),
    AccuracyArgs(), SearchArgs(), ConfigFileArgs(),
    ReportArgs(resume="Reuse the candidates already measured in the first --report FILE.json (default report: "
               "OUTPUT with .report.json).", default_json=lambda ctx: ctx[ConfigFileArgs].with_suffix(".report.json")),
    InputArgs(value_range=False), RunnerArgs(), OutputArgs(), order=ORDER,
)
def tune_command(model, target, precisions, shapes, gate, search, output, reports, given, runner, as_json) -> None:
    """Search MODEL's fastest configuration on a target and write it (a `tune` reads no --config)."""
    from onnxaccel.bench.config import save_config
    from onnxaccel.bench.report import clean
    from onnxaccel.bench.tune import TuneSettings, tune  # heavy: loaded per command (keeps --help fast)

    settings = TuneSettings(
        batches=shapes.batches, shapes=shapes.shapes, precisions=search.precisions, gate=gate,
        latency_budget_ms=search.latency_budget, warmup=search.warmup, duration=search.duration,
        confirm_duration=search.confirm_duration, time_budget_s=search.time_budget, threads=search.threads,
        seed=given.seed, inputs=given.items, strict=runner.strict, gpu_name=search.gpu, instances=search.instances,
        shape_buckets=shapes.buckets,
    )
    command = "onnxaccel tune " + shlex.join([model, "--target", str(target)] + search.flags)
    paths = list(reports.paths)
    with SweepProgress(disable=as_json) as progress:
        result = tune(model, target, settings, report_paths=paths, report=reports.previous(),
                      on_event=progress.event, command=command)
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


def _stem(model: str) -> str:
    name = model[4:] if model.startswith("zoo:") else Path(model).stem
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "model"
