"""`onnxaccel zoo list|get`: the built-in models (no network)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import typer

from onnxaccel.cli.args_data import OutputArgs
from onnxaccel.cli.args_model import SourceArg
from onnxaccel.cli.common import console, handle_errors, print_json
from onnxaccel.cli.compose import REQUIRED, Built, Group, composed, option
from onnxaccel.cli.tables import columns, new_table


class ZooOutputArgs(Group):
    """--output: where `zoo get` writes the model."""

    PARAMS = (option("output", Path, REQUIRED, "--output", "-o", help="Where to write the .onnx file."),)

    def build(self, v: SimpleNamespace, ctx: Built) -> Path:
        """The object the class docstring names, from the options' values."""
        return v.output


def register(app: typer.Typer) -> None:
    """Add the ``zoo`` command group to the application."""
    zoo_app = typer.Typer(help="Built-in models, built locally on first use (no network).", no_args_is_help=True)
    zoo_app.command("list", help="List the built-in models.")(list_command)
    zoo_app.command("get", help="Build (once) and write a built-in model to a file.")(get_command)
    app.add_typer(zoo_app, name="zoo")


@handle_errors
@composed(OutputArgs())
def list_command(as_json: bool) -> None:
    """Print the built-in models, as a table or as JSON."""
    from onnxaccel.zoo import list_models, zoo_cache_dir  # the recipes (onnx, numpy): imported when used

    entries = list_models()
    if as_json:
        print_json({"schema": "onnxaccel.zoo/1", "cache_dir": str(zoo_cache_dir()),
                    "models": [e.to_dict() for e in entries]})
        return
    table = columns(new_table(f"built-in models (use as zoo:NAME; cached in {zoo_cache_dir()})"),
                    ("name", "family", "params", "description"), numbers=("params",))
    for e in entries:
        table.add_row(e.name, e.family, f"{e.parameters / 1e6:.1f} M", e.description)
    console.print(table)


@handle_errors
@composed(SourceArg("Model name (with or without the zoo: prefix).", name="name"), ZooOutputArgs(), OutputArgs())
def get_command(name: str, output: Path, as_json: bool) -> None:
    """Build a built-in model (once, cached) and write it to a file."""
    from onnxaccel.zoo import export_model

    name = name.removeprefix("zoo:")
    path = export_model(name, output)
    if as_json:
        print_json({"schema": "onnxaccel.zoo-get/1", "name": name, "path": str(path),
                    "bytes": path.stat().st_size})
        return
    console.print(f"wrote zoo:{name} to {path} ({path.stat().st_size / 1e6:.1f} MB)")
