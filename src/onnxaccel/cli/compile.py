"""`onnxaccel compile SOURCE -o DIR`: compile ahead of time what a start of `serve`, `batch` or `run` will build,
into a directory those commands then use read-only (``ONNXACCEL_ARTIFACTS=DIR``; engines/artifacts.py).

Exactly as the consumer will: the command plans with the consumer's own calls (serve's ``_model_defaults`` and
each model's ``ModelConfig.plan``, batch's ``plan_job``, run's ``prepare``) and then runs the consumer's own
start-up path inside a writable store (transform/artifacts_build.py ``compiling``): serve's ``load_instance``
(embedded preprocessing, a session per padded batch size, every shape bucket warmed), batch's ``BatchWorker``,
run's ``prepare`` and first run. Every runner those paths build goes through ``pipeline.RunnerFromVariant``,
which makes and records its artifact: the converted variant, the ONNX Runtime optimized model, the MIGraphX
programs per input shape (EP or native engine), TensorRT engines. What it made and what it found already made
is listed, with sizes and times; ``--json`` prints schema ``onnxaccel.compile/1``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace

import typer
from rich.markup import escape

from onnxaccel.cli.args_data import OutputArgs, PreprocessArgs
from onnxaccel.cli.args_model import ConfigArgs, ShapeArgs, SourceArg, TargetArgs
from onnxaccel.cli.common import console, handle_errors, note, print_json
from onnxaccel.cli.compose import REQUIRED, Built, Group, composed, option
from onnxaccel.cli.tables import columns, new_table
from onnxaccel.errors import UsageError

SCHEMA = "onnxaccel.compile/1"
FOR = ("serve", "batch", "run")


class CompileArgs(Group):
    """Where the artifacts go (-o), which command will use them (--for) and serve's sizes (--max-batch,
    --instances): the flags that change what the consumer builds. Builds their values."""

    PARAMS = (
        option("output", Path, REQUIRED, "--output", "-o", help="The artifacts directory: new, empty, or one `compile` "
               "made on this machine (it is updated). Start the consumer with ONNXACCEL_ARTIFACTS=DIR."),
        option("for_command", str, "serve", "--for", help="The command that will start from DIR: serve (default), "
               "batch, or run (also bench). Give it the same --target, --config, shapes and sizes as that command."),
        option("max_batch", int | None, None, "--max-batch", help="serve: its --max-batch (default as serve's): "
               "GPU targets pad batches to powers of two up to it, and each padded size is compiled."),
        option("instances", int | None, None, "--instances", min=1, help="serve: its --instances, when it is "
               "given one (a layout given by hand turns off automatic graph capture, which changes the target)."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        if v.for_command not in FOR:
            raise UsageError(f"--for {v.for_command}: not a command that starts from artifacts.",
                             f"Use one of: {', '.join(FOR)}.")
        return v


@dataclasses.dataclass
class CompileResult:
    """What `compile` did: the plans it compiled for, every artifact of the directory (made now or kept), the
    sessions built and programs compiled or loaded, and the wall time."""

    source: str
    command: str
    directory: str
    manifest: str
    plans: list[dict]
    artifacts: list[dict]
    counts: dict
    seconds: float

    def to_dict(self) -> dict:
        """JSON-ready, schema ``SCHEMA``."""
        return {"schema": SCHEMA, **dataclasses.asdict(self)}


def register(app: typer.Typer) -> None:
    """Add `compile` to the `onnxaccel` app."""
    app.command("compile", help="Compile ahead of time what serve, batch or run will build (precision variants, "
                "ONNX Runtime optimized models, MIGraphX programs per batch size and bucket, TensorRT engines) into "
                "a directory; start that command with ONNXACCEL_ARTIFACTS=DIR and it loads them read-only, "
                "compiling nothing. A directory made with other versions or hardware is refused, naming what "
                "differs.")(compile_command)


@handle_errors
@composed(
    SourceArg("An .onnx file, zoo:NAME, or (--for serve) a folder of models as serve takes it."),
    TargetArgs(config=True), ConfigArgs("target, shapes, batch size and instance count"),
    ShapeArgs(buckets="The consumer's --shape-buckets: each bucket is compiled."),
    PreprocessArgs("The consumer's --preprocess (an image preset): on GPU targets serve and batch embed it in the "
                   "model, and the embedded copy is compiled.", check=True,
                   embed=("The consumer's --embed-preprocess (auto, none or a preset).", "auto")),
    CompileArgs(), OutputArgs(),
)
def compile_command(source: str, target, tuned, shapes, preprocess, job, as_json: bool) -> None:
    """Plan as the consumer will, run its start-up path in a writable artifacts store, and list the artifacts."""
    from onnxaccel.engines.build_counts import build_counts
    from onnxaccel.transform.artifacts_build import compiling

    started, before = time.perf_counter(), build_counts()
    prepare = {"serve": _for_serve, "batch": _for_batch, "run": _for_run}[job.for_command]
    with compiling(job.output) as store:
        plans = prepare(source, target, tuned, shapes, preprocess, job)
    made = {a.id for a in store.made}
    counts = {k: v - before[k] for k, v in build_counts().items()}
    result = CompileResult(source, job.for_command, str(store.root), str(store.root / "manifest.json"), plans,
                           [{**a.to_dict(), "made": a.id in made} for a in store.manifest.artifacts], counts,
                           time.perf_counter() - started)
    if as_json:
        print_json(result.to_dict())
        return
    _print(result)


def _for_serve(source, target, tuned, shapes, preprocess, job) -> list[dict]:
    """serve's defaults and plan (cli/serve.py ``_model_defaults``, from serve's own flag defaults with what was
    given here), then each model of the source loaded as the server loads it, with one instance (the
    instance count is not part of any artifact's key) and closed again."""
    from onnxaccel.cli.args_serve import BatcherArgs, LayoutArgs, SessionArgs
    from onnxaccel.cli.serve import _model_defaults
    from onnxaccel.model import load_model
    from onnxaccel.serve.config import model_config_from
    from onnxaccel.serve.repository import discover, load_instance

    batcher = _defaults(BatcherArgs, max_batch=job.max_batch, instances=job.instances)
    flags = LayoutArgs().build(_defaults(LayoutArgs), None)
    session = SessionArgs().build(_defaults(SessionArgs), None)
    defaults, _ = _model_defaults(target, tuned, shapes, batcher, flags, preprocess, session, False)
    plans = []
    for name, model_source, config_file in discover(source):
        config = dataclasses.replace(model_config_from(name, model_source, defaults, config_file), instances=1)
        load_instance(config).close()
        plans.append(config.plan(load_model(config.source)).to_dict())
    return plans


def _for_batch(source, target, tuned, shapes, preprocess, job) -> list[dict]:
    """batch's plan (scale/job.py ``plan_job``, embedding included) and its worker's start (scale/worker.py
    ``BatchWorker``: the bound model, the padded batch, the buckets), with one instance."""
    from onnxaccel.scale.datasets import Dataset
    from onnxaccel.scale.job import BatchJob, plan_job
    from onnxaccel.scale.worker import BatchWorker, WorkerSpec

    batch_job = BatchJob(model=source, input="", output="", target=target, batch=shapes.batch,
                         shapes=shapes.shapes, preprocess=preprocess.request, shape_buckets=shapes.buckets,
                         embed_preprocess=preprocess.embed or "auto")
    plan, path, _, _, _ = plan_job(batch_job)
    spec = WorkerSpec(path, plan, Dataset("arrays", "", ()), dict(batch_job.shapes), shape_buckets=shapes.buckets)
    BatchWorker(spec, instances=1).close()
    return [plan.to_dict()]


def _for_run(source, target, tuned, shapes, preprocess, job) -> list[dict]:
    """run's (and bench's) ``prepare`` at the given shapes and batch size; on a target that compiles per input
    shape (MIGraphX, TensorRT) one run too, where the provider compiles."""
    from onnxaccel.engines.buckets import compiles_per_shape
    from onnxaccel.pipeline import prepare

    prepared = prepare(source, target, shapes=shapes.shapes, batch=shapes.batch, command="run")
    try:
        if compiles_per_shape(prepared.plan.target):
            prepared.run()
    finally:
        prepared.close()
    return [prepared.plan.to_dict()]


def _defaults(group, **given) -> SimpleNamespace:
    """A serve flag group's values as serve's defaults, with the values given here (None: not given)."""
    values = {p.name: p.default for p in group().params()}
    values.update({k: v for k, v in given.items() if v is not None})
    return SimpleNamespace(**values)


def _print(result: CompileResult) -> None:
    """The artifacts as a table (80 columns), then the counts."""
    # The id's kind says what it is (the --json has the words); 8 hex digits of its digest tell entries apart.
    table = columns(new_table(f"artifacts in {escape(result.directory)}"),
                    ("artifact", "for", "shapes", "MB", "s", "now"), numbers=("MB", "s"))
    for a in result.artifacts:
        key = a["key"]
        shapes = " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in (key.get("shapes") or {}).items())
        table.add_row(escape(a["id"][:-12]), escape(key.get("preset") or key.get("target") or ""), escape(shapes),
                      f"{a['size_bytes'] / 1e6:.2f}", "-" if a["seconds"] is None else f"{a['seconds']:.2f}",
                      "made" if a["made"] else "kept")
    console.print(table)
    counts = result.counts
    note(f"{counts['sessions']} session(s) built, {counts['compiled']} program(s) compiled, {counts['loaded']} "
         f"loaded, in {result.seconds:.1f} s; start {result.command} with ONNXACCEL_ARTIFACTS={result.directory}")
