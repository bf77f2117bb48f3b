"""`onnxaccel compare`: the same inputs through two targets or precisions; pass or fail, and where it breaks."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from onnxaccel.analysis.compare import TargetComparison, compare_targets
from onnxaccel.cli.common import (
    BatchOpt, EpOptionOpt, JsonOpt, ShapeOpt, StrictOpt, ValueRangeOpt, console, err_console, handle_errors, note, print_json,
    resolve_target, warn,
)
from onnxaccel.cli.tables import columns, new_table
from onnxaccel.compare import check_tolerances, default_tolerances
from onnxaccel.errors import UsageError
from onnxaccel.inputs import parse_value_ranges
from onnxaccel.model import parse_shape_bindings
from onnxaccel.target import Target


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command to the application."""
    app.command("compare", help="Run a model on two targets or precisions with the same inputs and compare the "
                "outputs: max/mean absolute and relative error, cosine similarity, NaN/Inf counts, top-k agreement; "
                "exit status 0 when every output is within --atol/--rtol, 1 when not. --bisect names the first "
                "node where the two diverge.")(compare_command)


@handle_errors
def compare_command(
    model: Annotated[str, typer.Argument(help="An .onnx file or a built-in zoo:NAME.")],
    target: Annotated[list[str] | None, typer.Option("--target", "-t", help="Reference, then candidate (give it "
                      "twice). One target alone is compared with cpu, or with itself at each --precision. "
                      "--ep-option applies to the candidate.")] = None,
    precision: Annotated[list[str] | None, typer.Option("--precision", "-p", help="fp32, fp16 or int8; once "
                         "(candidate precision) or twice (reference, candidate).")] = None,
    ep_option: EpOptionOpt = None,
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE (.npy, .npz, .pb, image) or "
                      "NAME=VALUE; inputs not given are synthesized (same values on both sides).")] = None,
    shape: ShapeOpt = None,
    batch: BatchOpt = None,
    atol: Annotated[float | None, typer.Option(help="Absolute tolerance (default by precision: fp32 1e-4, fp16 "
                    "1e-2, int8 5e-2).")] = None,
    rtol: Annotated[float | None, typer.Option(help="Relative tolerance, times |reference| (default: fp32 1e-3, "
                    "fp16 5e-2, int8 1e-1).")] = None,
    topk: Annotated[int, typer.Option("--topk", "-k", help="K for top-k agreement of classifier outputs.")] = 5,
    bisect: Annotated[bool, typer.Option("--bisect", help="When outputs differ, find the first diverging node "
                      "(a few intermediate tensors per session, bisecting along the graph).")] = False,
    per_session: Annotated[int, typer.Option(help="Intermediate tensors exposed per bisection session.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed for synthesized inputs.")] = 0,
    value_range: ValueRangeOpt = None,
    strict: StrictOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Compare a model's outputs on two targets/precisions; exit 1 when they differ beyond tolerance."""
    reference, candidate = resolve_pair(target or [], precision or [], ep_option)
    default_atol, default_rtol = default_tolerances(reference, candidate)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    check_tolerances(atol, rtol)
    if per_session < 1:
        raise UsageError(f"--per-session must be at least 1, got {per_session}.", "e.g. --per-session 4")
    comparison = compare_targets(model, reference, candidate, atol=atol, rtol=rtol, topk=topk, inputs=inputs or [],
                                 shapes=parse_shape_bindings(shape or []), batch=batch, seed=seed, strict=strict,
                                 value_ranges=parse_value_ranges(value_range))
    divergence = None
    if bisect and not comparison.result.passed:
        from onnxaccel.analysis.bisect import find_divergence  # heavy: loaded only for --bisect

        divergence = find_divergence(comparison.bound_model, reference, candidate, comparison.feeds, atol=atol,
                                     rtol=rtol, per_session=per_session)
    if as_json:
        print_json(comparison.to_dict() | {"divergence": divergence.to_dict() if divergence else None})
    else:
        _render(comparison, divergence, bisect)
    if not comparison.result.passed:
        raise typer.Exit(1)


def resolve_pair(targets: list[str], precisions: list[str], options: list[str] | None) -> tuple[Target, Target]:
    """Reference and candidate from the repeated --target/--precision options (see the option help)."""
    if not targets:
        raise UsageError("compare needs --target (once or twice).",
                         "e.g. --target cpu --target cuda, or --target cuda --precision fp16")
    if len(targets) > 2 or len(precisions) > 2:
        raise UsageError("compare takes at most two --target and two --precision options.",
                         "Compare two at a time.")
    if len(targets) == 1 and not precisions:
        pair = [resolve_target("cpu", None, None), resolve_target(targets[0], None, options)]
    elif len(targets) == 1:
        base = resolve_target(targets[0], None, options)
        if len(precisions) == 1:
            pair = [base, resolve_target(str(base), precisions[0], None)]
        else:
            pair = [resolve_target(str(base), p, None) for p in precisions]
    else:
        # --ep-option belongs to the candidate: the reference is often the CPU, which takes no provider options.
        prec = precisions if len(precisions) == 2 else (precisions or [None]) * 2
        pair = [resolve_target(targets[0], prec[0], None), resolve_target(targets[1], prec[1], options)]
    if str(pair[0]) == str(pair[1]):
        raise UsageError(f"Both sides are '{pair[0]}'; there is nothing to compare.",
                         "Give two different targets (--target cpu --target cuda) or a --precision for the "
                         "candidate (--target cuda --precision fp16).")
    return pair[0], pair[1]


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
