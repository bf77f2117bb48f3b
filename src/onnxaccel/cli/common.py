"""What every command shares: the console, error handling, --json output, target resolution."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from onnxaccel.engines import best_target
from onnxaccel.errors import OnnxAccelError
from onnxaccel.target import parse_target

console = Console()
err_console = Console(stderr=True)

#: Set by the root callback (--debug, --verbose).
STATE = {"debug": False, "verbose": False}

def handle_errors(func: Callable) -> Callable:
    """Print OnnxAccelError as message + hint and exit 1 (2 for usage); a traceback only with --debug."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except OnnxAccelError as exc:
            if STATE["debug"]:
                raise
            report_error(exc, as_json=bool(kwargs.get("as_json")))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - a bug of ours: say so, without a traceback
            if STATE["debug"]:
                raise
            err_console.print(f"[bold red]internal error:[/] {type(exc).__name__}: {escape(str(exc))}", highlight=False)
            err_console.print("[bold cyan]hint:[/] this is a bug in onnxaccel; rerun with --debug and report the "
                              "traceback.", highlight=False)
            raise typer.Exit(1) from None

    return wrapper


def report_error(exc: OnnxAccelError, *, as_json: bool = False) -> None:
    """Print an error as JSON (with --json) or as message + hint on stderr; details only with --debug."""
    if as_json:
        print(json.dumps(exc.to_dict(), indent=2))
        return
    err_console.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False)
    if exc.hint:
        err_console.print(f"[bold cyan]hint:[/] {escape(exc.hint)}", highlight=False)
    if exc.details and STATE["debug"]:
        err_console.print(exc.details, highlight=False, markup=False)


def print_json(data: dict) -> None:
    """Write ``data`` to stdout as indented JSON (what --json prints)."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def warn(message: str) -> None:
    """A warning on stderr: something the user should act on."""
    err_console.print(f"[bold yellow]warning:[/] {escape(message)}", highlight=False)


def note(message: str) -> None:
    """A dim note on stderr: context, nothing to act on."""
    err_console.print(f"[dim]note: {escape(message)}[/]", highlight=False)


def resolve_target(text: str, precision: str | None, options: list[str] | None):
    """Parse --target/--precision/--ep-option; 'auto' picks the fastest target that really loads."""
    if text.strip().lower().startswith("auto"):
        best, skipped = best_target()
        for reason in skipped:
            note(f"skipped {reason}")
        rest = text.strip()[4:]
        return parse_target(str(best) + rest, precision=precision, options=options or [])
    return parse_target(text, precision=precision, options=options or [])
