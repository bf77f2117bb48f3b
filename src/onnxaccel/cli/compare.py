"""`onnxaccel compare`: the same inputs through two targets or precisions; pass or fail, and where it breaks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from onnxaccel.cli.args_data import InputArgs, OutputArgs, RunnerArgs
from onnxaccel.cli.args_model import ShapeArgs, SourceArg, TargetArgs, resolve_pair
from onnxaccel.cli.common import console, err_console, handle_errors, note, print_json, warn
from onnxaccel.cli.compose import Built, Group, composed, option
from onnxaccel.cli.tables import columns, new_table
from onnxaccel.errors import UsageError

if TYPE_CHECKING:
    from onnxaccel.analysis.compare import TargetComparison

__all__ = ["compare_command", "register", "resolve_pair"]

#: The order of the options in --help.
ORDER = ("model target precision ep_option inputs shape batch atol rtol topk bisect per_session seed value_range "
         "strict as_json")


class VerdictArgs(Group):
    """What decides and explains the verdict: --atol, --rtol (defaults by the pair's precisions), --topk,
    --bisect, --per-session. Builds their values with the tolerances resolved and checked."""

    PARAMS = (
        option("atol", float | None, None, help="Absolute tolerance (default by precision: fp32 1e-4, fp16 1e-2, "
               "int8 5e-2)."),
        option("rtol", float | None, None, help="Relative tolerance, times |reference| (default: fp32 1e-3, fp16 "
               "5e-2, int8 1e-1)."),
        option("topk", int, 5, "--topk", "-k", help="K for top-k agreement of classifier outputs."),
        option("bisect", bool, False, "--bisect", help="When outputs differ, find the first diverging node (a few "
               "intermediate tensors per session, bisecting along the graph)."),
        option("per_session", int, 4, help="Intermediate tensors exposed per bisection session."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        from onnxaccel.compare import check_tolerances, default_tolerances  # numpy: imported when the command runs

        default_atol, default_rtol = default_tolerances(*ctx[TargetArgs])
        atol = default_atol if v.atol is None else v.atol
        rtol = default_rtol if v.rtol is None else v.rtol
        check_tolerances(atol, rtol)
        if v.per_session < 1:
            raise UsageError(f"--per-session must be at least 1, got {v.per_session}.", "e.g. --per-session 4")
        return SimpleNamespace(**{**vars(v), "atol": atol, "rtol": rtol})


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command to the application."""
    app.command("compare", help="Run a model on two targets or precisions with the same inputs and compare the "
                "outputs: max/mean absolute and relative error, cosine similarity, NaN/Inf counts, top-k agreement; "
                "exit status 0 when every output is within --atol/--rtol, 1 when not. --bisect names the first "
                "node where the two diverge.")(compare_command)


@handle_errors
@composed(
    SourceArg("An .onnx file or a built-in zoo:NAME."),
    TargetArgs(kind="pair", help="Reference, then candidate (give it twice). One target alone is compared with "
               "cpu, or with itself at each --precision. --ep-option applies to the candidate.",
               precision="fp32, fp16 or int8; once (candidate precision) or twice (reference, candidate)."),
    InputArgs("NAME=FILE (.npy, .npz, .pb, image) or NAME=VALUE; inputs not given are synthesized (same values on "
              "both sides)."),
    ShapeArgs(), VerdictArgs(), RunnerArgs(), OutputArgs(), order=ORDER,
)
def compare_command(model, pair, given, shapes, verdict, runner, as_json) -> None:
    """Compare a model's outputs on two targets/precisions; exit 1 when they differ beyond tolerance."""
    from onnxaccel.analysis.compare import compare_targets

    reference, candidate = pair
    comparison = compare_targets(model, reference, candidate, atol=verdict.atol, rtol=verdict.rtol, topk=verdict.topk,
                                 inputs=list(given.items), shapes=shapes.shapes, batch=shapes.batch, seed=given.seed,
                                 strict=runner.strict, value_ranges=given.value_ranges)
    divergence = None
    if verdict.bisect and not comparison.result.passed:
        from onnxaccel.analysis.bisect import find_divergence  # heavy: loaded only for --bisect

        divergence = find_divergence(comparison.bound_model, reference, candidate, comparison.feeds,
                                     atol=verdict.atol, rtol=verdict.rtol, per_session=verdict.per_session)
    if as_json:
        print_json(comparison.to_dict() | {"divergence": divergence.to_dict() if divergence else None})
    else:
        _render(comparison, divergence, verdict.bisect)
    if not comparison.result.passed:
        raise typer.Exit(1)


def _render(c: TargetComparison, divergence, bisect: bool) -> None:
    r = c.result
    shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in c.input_shapes.items())
    console.print(f"[bold]{escape(c.model)}[/]: reference [bold]{escape(c.reference.target)}[/] "
                  f"({c.reference.providers[0]}) vs candidate [bold]{escape(c.candidate.target)}[/] "
                  f"({c.candidate.providers[0]}); inputs {escape(shapes)}")
    for run in (c.reference, c.candidate):
        console.print(f"  {escape(run.target)}: {escape(run.placement['summary'])}")
    for text in dict.fromkeys(c.reference.warnings + c.candidate.warnings + c.notes):
        (warn if "fall" in text or "took" in text else note)(text)
    table = columns(new_table(f"outputs (atol={r.atol:g}, rtol={r.rtol:g})"),
                    ("output", "shape", "max abs", "mean abs", "rel L2", "cosine", "NaN/Inf", "result"),
                    numbers=("max abs", "mean abs", "rel L2", "cosine", "NaN/Inf"))
    for o in r.outputs:
        nonfinite = f"{o.nan[1] + o.inf[1]}" + (f" (ref {o.nan[0] + o.inf[0]})" if o.nan[0] + o.inf[0] else "")
        table.add_row(escape(o.name), "x".join(map(str, o.shape)), f"{o.max_abs:.3g}", f"{o.mean_abs:.3g}",
                      f"{o.rel_l2:.3g}", f"{o.cosine:.6f}", nonfinite, "[green]pass[/]" if o.passed else "[red]FAIL[/]")
    console.print(table)
    for o in r.outputs:
        if not o.passed:
            console.print(f"  [red]{escape(o.name)}[/]: {escape(o.reason or '')}; it would pass with --atol "
                          f"{o.required_atol:.3g}")
        if o.topk:
            console.print(f"  {escape(o.name)}: top-1 agreement {100 * o.topk.top1:.1f}% of {o.topk.rows} row(s), "
                          f"top-{o.topk.k} overlap {100 * o.topk.topk_overlap:.1f}%")
    if r.missing:
        console.print(f"[red]outputs on one side only:[/] {escape(', '.join(r.missing))}")
    console.print("[bold green]PASS[/]" if r.passed else "[bold red]FAIL[/]")
    if divergence is not None:
        _render_divergence(divergence)
    elif not r.passed and not bisect:
        err_console.print("[dim]hint: --bisect finds the first node where the two diverge.[/]")


def _render_divergence(d) -> None:
    console.print(f"\n[bold]bisection[/] ({d.sessions} sessions over {d.candidates} candidate tensors): "
                  f"{escape(d.message)}")
    for cause in d.causes:
        console.print(f"  likely cause: weight {escape(cause)}")
    if d.found and d.inputs:
        table = columns(new_table(f"inputs of {escape(d.node)}: within tolerance"),
                        ("tensor", "from node", "rel L2", "max abs"), numbers=("rel L2", "max abs"))
        for i in d.inputs:
            table.add_row(escape(i.tensor), escape(i.node), f"{i.comparison.rel_l2:.3g}",
                          f"{i.comparison.max_abs:.3g}")
        console.print(table)
    for text in d.notes:
        note(text)
