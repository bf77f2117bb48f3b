"""`onnxaccel check`: run ONNX test-case folders on a target and compare with their expected outputs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import typer
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from onnxaccel.cli.args_data import OutputArgs, RunnerArgs
from onnxaccel.cli.args_model import TargetArgs
from onnxaccel.cli.common import console, err_console, handle_errors, note, print_json
from onnxaccel.cli.compose import REQUIRED, Built, Group, argument, composed, option
from onnxaccel.cli.tables import number_column, text_column
from onnxaccel.errors import UsageError

_STYLE = {"pass": "green", "fail": "bold red", "error": "red", "skipped": "yellow"}
#: The order of the options in --help.
ORDER = "paths target precision ep_option atol rtol tolerances filters keep_going strict as_json"


class CasesArgs(Group):
    """The test cases: PATHS, --filter globs, --keep-going/--fail-fast. Builds the cases found (UsageError when
    the filters leave none) and ``keep_going``."""

    PARAMS = (
        argument("paths", list[Path], REQUIRED, help="Test case folders, or parent folders to search for them."),
        option("filters", list[str] | None, None, "--filter", "-f", help="Run only cases whose name matches this "
               "glob (e.g. '*conv*'); repeatable."),
        option("keep_going", bool, True, "--keep-going/--fail-fast", " /-x", help="Run every case (default), or "
               "stop at the first failure or error."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        from onnxaccel.conformance import discover  # heavy: loaded per command

        ctx[TolerancesArgs]  # the options are checked before the cases are searched
        cases = discover([str(p) for p in v.paths], patterns=v.filters or ())
        if not cases:
            raise UsageError(f"No test case matches --filter {' '.join(v.filters or [])}.",
                             "Check the glob; case names are paths like node/test_abs.")
        return SimpleNamespace(cases=cases, keep_going=v.keep_going)


class TolerancesArgs(Group):
    """--atol, --rtol and --tolerances (fp32|fp16: another precision's defaults). Builds the policy for the
    target's precision."""

    PARAMS = (
        option("atol", float | None, None, "--atol", help="Absolute tolerance for every float output (default: the "
               "case's data.json, else ONNX's 1e-7; 1e-3 at fp16)."),
        option("rtol", float | None, None, "--rtol", help="Relative tolerance for every float output (default: the "
               "case's data.json, else ONNX's 1e-3; 1e-2 at fp16)."),
        option("tolerances", str | None, None, "--tolerances", help="Default tolerances of this precision (fp32 or "
               "fp16) instead of the target's, e.g. fp16 for a model `optimize --fp16` wrote."),
    )

    def build(self, v: SimpleNamespace, ctx: Built):
        """The object the class docstring names, from the options' values."""
        from onnxaccel.conformance import TolerancePolicy  # heavy: loaded per command

        for label, value in (("atol", v.atol), ("rtol", v.rtol)):
            if value is not None and not (value >= 0 and value != float("inf")):
                raise UsageError(f"--{label} must be a finite number >= 0, got {value}.", f"e.g. --{label} 1e-3")
        if v.tolerances not in (None, "fp32", "fp16"):
            raise UsageError(f"--tolerances must be fp32 or fp16, got '{v.tolerances}'.", "e.g. --tolerances fp16")
        return TolerancePolicy(precision=v.tolerances or ctx[TargetArgs].precision, rtol=v.rtol, atol=v.atol)


def register(app: typer.Typer) -> None:
    """Add the ``check`` command to the application."""
    app.command("check", help="Run ONNX test cases (model.onnx + test_data_set_N/input_K.pb, output_K.pb, as "
                "ONNX's backend tests and the ONNX Model Zoo ship them) on a target and compare every output "
                "with the expected one. Exit 1 on any failure or error.")(check_command)


@handle_errors
@composed(CasesArgs(), TargetArgs(), TolerancesArgs(), RunnerArgs(), OutputArgs(), order=ORDER)
def check_command(found, target, policy, runner, as_json) -> None:
    """Run ONNX test cases on a target and exit 1 on any failure or error."""
    from onnxaccel.conformance import run_check  # heavy: loaded per command

    cases, keep_going, strict = found.cases, found.keep_going, runner.strict
    if as_json:
        report = run_check(cases, target, policy=policy, keep_going=keep_going, strict=strict)
        print_json(report.to_dict())
        raise typer.Exit(report.exit_code)
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True,
                  disable=len(cases) < 5 or not err_console.is_terminal) as progress:
        task = progress.add_task("checking", total=len(cases))

        def advance(result) -> None:
            progress.update(task, advance=1, description=f"checking {result.name[-30:]}")

        report = run_check(cases, target, policy=policy, keep_going=keep_going, strict=strict, on_case=advance)
    render(report)
    raise typer.Exit(report.exit_code)


def render(report) -> None:
    """Print the check report as a table of cases with the worst output of each."""
    for message in report.notes:
        note(message)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, expand=False)
    table.add_column("case", no_wrap=True, overflow="ellipsis", max_width=30)
    table.add_column("status", no_wrap=True, width=7)
    number_column(table, "time", min_width=6)
    # folds rather than cuts: a cut would hide the digits of the worst error
    text_column(table, "worst error / reason")
    for case in report.cases:
        style = _STYLE.get(case.status, "")
        table.add_row(escape(_short(case.name, 30)), f"[{style}]{case.status}[/]", _seconds(case.seconds),
                      escape(case.detail()))
    console.print(table, width=min(console.width, 80))
    hints: dict[str, list[str]] = {}
    for case in report.cases:
        if case.status in ("error", "fail") and case.hint:
            hints.setdefault(case.hint, []).append(case.name)
    for hint, names in hints.items():
        where = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more"
        console.print(f"[bold cyan]hint[/] ({escape(where)}): {escape(hint)}", highlight=False)
    providers = ", ".join(p.replace("ExecutionProvider", "") for p in report.providers) or "none"
    colour = "green" if report.ok else "bold red"
    console.print(f"[{colour}]{report.summary()}[/]", highlight=False)
    console.print(f"target {escape(report.target)}: ran on {providers}, precision {report.precision}",
                  highlight=False)


def _seconds(value: float) -> str:
    return f"{value * 1e3:.0f}ms" if value < 1 else f"{value:.1f}s"


def _short(name: str, width: int) -> str:
    """Keep the end of a long case name, where the case's own name is."""
    return name if len(name) <= width else "…" + name[-(width - 1):]
