"""What every command shares: the console, error handling, --json output, common options."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

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

#: How images become tensors, the same in run, batch and optimize (docs/PREPROCESSING.md; prepost/presets.py).
PreprocessOpt = Annotated[str | None, typer.Option(
    "--preprocess", help="Image preset: imagenet|yolo|scale01|none. imagenet: resize the short side to 256/224 of "
    "the crop, center-crop, /255, ImageNet mean/std; yolo: letterbox to the model's size, gray 114 padding, /255; "
    "scale01: /255; none: raw 0..255. (default: from the model's metadata (Ultralytics task=detect -> yolo, "
    "onnxaccel.preprocess), else none with a note; --resize/--mean/--std alone imply imagenet)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (for programs) instead of tables.")]
#: The --target help; cli/groups.py's TargetOpt (commands with --config) adds its default to it.
TARGET_HELP = ("Where to run: auto, cpu, cuda[:ID], migraphx[:ID], rocm, tensorrt; optionally /PRECISION and "
               "?KEY=VALUE (e.g. cuda:0/fp16?prefer_nhwc=1). auto = the fastest target that really loads here.")
#: Commands without --config; those with one take cli/groups.py's (default None: flag > config > default).
TargetOpt = Annotated[str, typer.Option("--target", "-t", help=TARGET_HELP)]
PrecisionOpt = Annotated[
    str | None, typer.Option("--precision", "-p", help="fp32, fp16 or int8 (overrides the target string).")
]
EpOptionOpt = Annotated[
    list[str] | None,
    typer.Option("--ep-option", help="Provider or session option KEY=VALUE; repeatable. Unknown keys are "
                 "rejected with the list of valid ones."),
]
ShapeOpt = Annotated[
    list[str] | None,
    typer.Option("--shape", "-s", help="Bind an input's shape (NAME=1x3x224x224) or a symbolic dim "
                 "(sequence=128); repeatable."),
]
BatchOpt = Annotated[int | None, typer.Option("--batch", "-b", help="Batch size for every input's first axis.")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Fail when any node falls back from the target's "
                                         "provider to another (the CPU).")]
InputOpt = Annotated[
    list[str] | None,
    typer.Option("--input", "-i", help="NAME=FILE (.npy, .npz, .pb or an image) or NAME=VALUE (a number or JSON "
                 "list, e.g. sr=16000); a bare .npz feeds every input it names. Inputs not given are "
                 "synthesized (see docs/INPUTS.md)."),
]
ValueRangeOpt = Annotated[
    list[str] | None,
    typer.Option("--value-range", help="Range of synthesized values: NAME=LOW,HIGH for one input, LOW,HIGH for "
                 "all (floats uniform in [LOW, HIGH), integers LOW..HIGH); repeatable."),
]


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
