"""`onnxaccel cache list|clear|warm`: the compile caches (ORT-optimized graphs, MIGraphX .mxr programs,
TensorRT engines) and the converted models `run --precision` keeps."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import typer
from rich.markup import escape

from onnxaccel.cli.args_data import OutputArgs
from onnxaccel.cli.args_model import ShapeArgs, SourceArg, TargetArgs
from onnxaccel.cli.common import console, handle_errors, note, print_json
from onnxaccel.cli.compose import Built, Group, composed, option
from onnxaccel.cli.tables import columns, new_table
from onnxaccel.errors import UsageError
from onnxaccel.paths import runtime_models_dir

SCHEMA = "onnxaccel.cache/1"

cache_app = typer.Typer(help="Compile caches: what is cached, keyed by what, how big; clear them; time a cold "
                        "and a warm compile.", no_args_is_help=True)


class ClearArgs(Group):
    """Which entries `cache clear` deletes: --stale, --entry prefixes, --converted."""

    PARAMS = (
        option("stale", bool, False, "--stale", help="Only entries built by other runtime versions."),
        option("entry", list[str] | None, None, "--entry", help="Only entries whose name starts with this; "
               "repeatable."),
        option("converted", bool, False, "--converted", help="Also delete converted models."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        return v


def register(app: typer.Typer) -> None:
    """Add the ``cache`` command group to the application."""
    app.add_typer(cache_app, name="cache")


@dataclass
class CacheListing:
    """Every compile cache entry and the converted models on disk, for ``cache list``."""
    root: str
    entries: list = field(default_factory=list)
    converted_models: int = 0
    converted_bytes: int = 0

    def to_dict(self) -> dict:
        """JSON-ready listing (schema ``SCHEMA``) with total sizes."""
        return {"schema": SCHEMA, "root": self.root, "entries": [e.to_dict() for e in self.entries],
                "total_bytes": sum(e.size_bytes for e in self.entries),
                "converted_models": {"count": self.converted_models, "bytes": self.converted_bytes}}


def listing() -> CacheListing:
    """List the compile cache entries and the converted models kept beside them."""
    from onnxaccel.transform.compile_cache import compile_cache_dir, list_entries  # onnx: imported when used

    converted = _converted_files()
    return CacheListing(str(compile_cache_dir()), list_entries(), len([p for p in converted if p.suffix == ".onnx"]),
                        sum(p.stat().st_size for p in converted))


@cache_app.command("list", help="Every compile cache entry: kind, model, target, precision, shapes, runtime "
                   "versions, size, first-compile and warm-start times; stale = built by another runtime.")
@handle_errors
@composed(OutputArgs())
def list_command(as_json: bool) -> None:
    """Print the compile cache entries as a table, or as JSON."""
    result = listing()
    if as_json:
        print_json(result.to_dict())
        return
    if not result.entries:
        console.print(f"no compile cache entries in {escape(result.root)}")
    else:
        # 9 columns fit 80: the runtime version is left to --json (a stale entry is marked, which is what it
        # tells), and seconds and sizes carry their unit in the header
        table = columns(new_table(f"compile caches in {escape(result.root)}"),
                        ("entry", "model", "target", "shapes", "size", "first s", "warm s", "hits", "used"),
                        numbers=("size", "first s", "warm s", "hits", "used"))
        for e in result.entries:
            key = e.key
            shapes = " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in key.get("shapes", {}).items())
            name = e.name + (" [red](stale)[/]" if e.stale else "")
            name += f" [red]({escape(e.problem)})[/]" if e.problem else ""
            table.add_row(name, escape(Path(key.get("model", "?")).name), escape(key.get("target", "?")),
                          escape(shapes), _size(e.size_bytes).replace(" ", ""), _secs(e.first_compile_seconds),
                          _secs(e.warm_start_seconds), str(e.hits), _when(e.last_used))
        console.print(table)
        console.print(f"{len(result.entries)} entr{'y' if len(result.entries) == 1 else 'ies'}, "
                      f"{_size(sum(e.size_bytes for e in result.entries))}; keyed by model content (sha256), target "
                      "and options, precision, input shapes, runtime versions and host (see --json)")
    if result.converted_models:
        console.print(f"converted models (run --precision fp16/int8): {result.converted_models}, "
                      f"{_size(result.converted_bytes)}")


@cache_app.command("clear", help="Delete compile cache entries (all by default) and, with --converted, the "
                   "models converted for `run --precision`. The zoo is left alone.")
@handle_errors
@composed(ClearArgs(), OutputArgs())
def clear_command(which, as_json: bool) -> None:
    """Delete compile cache entries (all, stale ones or by name) and optionally the converted models."""
    from onnxaccel.transform.compile_cache import list_entries, remove_entries

    stale, entry, converted = which.stale, which.entry, which.converted
    chosen = list_entries()
    if stale:
        chosen = [e for e in chosen if e.stale or e.problem]
    if entry:
        chosen = [e for e in chosen if any(e.name.startswith(prefix) for prefix in entry)]
        if not chosen:
            raise UsageError(f"No cache entry starts with {', '.join(entry)}.", "See `onnxaccel cache list`.")
    freed = remove_entries(chosen)
    removed_converted = 0
    if converted:
        for path in _converted_files():
            freed += path.stat().st_size
            path.unlink(missing_ok=True)
            removed_converted += 1
    result = {"schema": SCHEMA, "removed": [e.name for e in chosen], "removed_converted_files": removed_converted,
              "freed_bytes": freed}
    if as_json:
        print_json(result)
        return
    console.print(f"removed {len(chosen)} entr{'y' if len(chosen) == 1 else 'ies'}"
                  + (f" and {removed_converted} converted file(s)" if converted else "") + f", freed {_size(freed)}")


@cache_app.command("warm", help="Compile a model for a target twice through its cache and report the first "
                   "compile and the warm start (session creation + first run): run it on the target machine.")
@handle_errors
@composed(SourceArg("An .onnx file or zoo:NAME."), TargetArgs(precision=None, ep_option=None), ShapeArgs(),
          OutputArgs())
def warm_command(model: str, tgt, shapes, as_json: bool) -> None:
    """Compile a model twice through its cache and report the cold and warm times."""
    from onnxaccel.inputs import synthesize
    from onnxaccel.model import load_model
    from onnxaccel.transform.cached_compile import compile_cached  # heavy: loaded per command

    bound = load_model(model).bind(shapes.shapes, batch=shapes.batch)
    feeds = synthesize(bound)
    runner, first = compile_cached(bound, tgt, feeds=feeds)
    runner.close()
    runner, warm = compile_cached(bound, tgt, feeds=feeds, key=first.key)
    runner.close()
    result = {"schema": SCHEMA, "model": model, "target": str(tgt), "first": first.to_dict(), "warm": warm.to_dict()}
    if as_json:
        print_json(result)
        return
    if first.key is None or first.uncached:
        note(first.notes[0])
    state = "was already cached" if first.hit else "compiled"
    console.print(f"{escape(model)} on {escape(str(tgt))}: first {first.seconds * 1e3:.0f} ms ({state}), warm start "
                  f"{warm.seconds * 1e3:.0f} ms ({_warm_state(warm)}); "
                  "session creation + first run")
    if first.key is not None and not first.uncached:
        console.print(f"cache entry: {escape(str(first.key.entry))}")


def _warm_state(warm) -> str:
    return "hit" if warm.hit else "not cached" if warm.uncached else "MISS: the cache did not work"


def _converted_files() -> list[Path]:
    return [p for p in runtime_models_dir().iterdir() if p.is_file()]


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _when(stamp: float | None) -> str:
    """Month, day and time of ``stamp``: short enough for an 80-column table (--json has the full time)."""
    return "-" if stamp is None else datetime.datetime.fromtimestamp(stamp).strftime("%m-%d %H:%M")
