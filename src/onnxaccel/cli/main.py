"""The `onnxaccel` command. Each command lives in its own module and registers itself here."""

from __future__ import annotations

from typing import Annotated

import typer

from onnxaccel import __version__
from onnxaccel.cli import (
    batch, bench, cache, compare, doctor, inspect, loadtest, monitor, optimize, profile, run, serve, tune, zoo,
)
from onnxaccel.cli.common import STATE

app = typer.Typer(
    name="onnxaccel",
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
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and raw runtime messages.")] = False,
) -> None:
    STATE["debug"] = debug


for module in (doctor, run, inspect, optimize, bench, tune, compare, profile, serve, loadtest, batch, monitor,
               cache, zoo):
    module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
