"""The `onnxaccel` command. Each command lives in its own module and registers itself here."""

from __future__ import annotations

from typing import Annotated

import typer

from onnxaccel import __version__, startup
from onnxaccel.cli import (
    batch, bench, cache, check, compare, doctor, inspect, loadtest, monitor, optimize, profile, run, serve, tune, zoo,
)
from onnxaccel.cli import compile as compile_cli
from onnxaccel.cli.common import STATE
from onnxaccel.cli.flags import DeprecatedFlagsGroup
from onnxaccel.engines.ort_log import set_runtime_log_level

app = typer.Typer(
    name="onnxaccel",
    cls=DeprecatedFlagsGroup,  # old short flags (-o for --ep-option, -O, loadtest -i) work one more release
    help="Take an ONNX model to fast, correct inference on AMD (MIGraphX), NVIDIA (CUDA) and CPU.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"onnxaccel {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and raw runtime messages (ONNX Runtime's "
                                        "log at verbose severity).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show ONNX Runtime's own warnings and errors on stderr "
                                          "(hidden by default; --json output on stdout stays JSON).")] = False,
) -> None:
    """Global options, applied before any command runs."""
    startup.record_import()  # the interpreter's start and every import, up to here
    STATE["debug"] = debug
    STATE["verbose"] = verbose

    set_runtime_log_level("debug" if debug else "verbose" if verbose else "quiet")


for module in (doctor, run, inspect, optimize, bench, tune, compare, profile, serve, loadtest, batch, monitor,
               cache, zoo, check, compile_cli):
    module.register(app)


def main() -> None:
    """Entry point of the ``onnxaccel`` console script."""
    app()


if __name__ == "__main__":
    main()
