"""Every command is composed from argument groups (cli/compose.py): its function is short and declares (almost)
no options of its own; the groups declare them, check them and build the objects the command works with.

A command that grows past :data:`MAX_LINES` or takes its flags one by one again (more than :data:`MAX_OWN`
options in its own signature) fails here: move the options into a group (cli/args_*.py, or a group beside the
command) and the work into helpers."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import textwrap

import pytest
import typer

from onnxaccel.cli.args_data import OutputArgs
from onnxaccel.cli.args_model import TargetArgs
from onnxaccel.cli.compose import composed
from onnxaccel.cli.main import app

#: Longest command function (its ``def`` line to its last line).
MAX_LINES = 60
#: Most options a command function may declare itself rather than take from groups.
MAX_OWN = 4


def registered(typer_app: typer.Typer, path: tuple[str, ...] = ()):
    """(command path, the callback Typer registered) for every command and subcommand of ``typer_app``."""
    for info in typer_app.registered_commands:
        yield " ".join((*path, info.name or info.callback.__name__)), info.callback
    for group in typer_app.registered_groups:
        yield from registered(group.typer_instance, (*path, group.name))


COMMANDS = dict(registered(app))


def body_lines(callback) -> int:
    """Lines of the command's own function (decorators left out), through the wrappers around it."""
    body = inspect.unwrap(callback)
    node = ast.parse(textwrap.dedent(inspect.getsource(body))).body[0]
    return node.end_lineno - node.lineno + 1


def own_params(callback) -> list[str]:
    """The options in the command's signature that no group of its declares."""
    from_groups = {p.name for g in getattr(callback, "__groups__", ()) for p in g.params()}
    return [name for name in inspect.signature(callback).parameters if name not in from_groups]


def test_every_command_is_found():
    assert {"serve", "optimize", "bench", "run", "batch", "tune", "loadtest", "cache warm", "zoo get"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_function_is_short_and_composed_from_groups(name):
    callback = COMMANDS[name]
    lines, own = body_lines(callback), own_params(callback)
    assert lines <= MAX_LINES, f"{name}: the command function is {lines} lines (at most {MAX_LINES}): move work " \
                               "into helpers and groups"
    assert len(own) <= MAX_OWN, f"{name} declares {len(own)} options itself ({', '.join(own)}): compose it from " \
                                "argument groups (cli/compose.py)"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_target_is_declared_by_target_args_only(name):
    callback = COMMANDS[name]
    declared = [g for g in getattr(callback, "__groups__", ()) if "target" in {p.name for p in g.params()}]
    if "target" in inspect.signature(callback).parameters:
        assert len(declared) == 1 and isinstance(declared[0], TargetArgs), f"{name}: --target not from TargetArgs"


def test_the_checks_catch_a_command_that_lists_its_flags(tmp_path):
    """A function with its flags spelled out in its signature (as `serve` had, 49 of them) and a long body fails
    both checks; composed from groups it has no options of its own."""
    path = tmp_path / "flat_command.py"
    path.write_text("def flat(a=0, b=0, c=0, d=0, e=0):\n" + "    a += 1\n" * MAX_LINES)
    spec = importlib.util.spec_from_file_location("flat_command", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert own_params(module.flat) == ["a", "b", "c", "d", "e"] and body_lines(module.flat) == MAX_LINES + 1
    grouped = composed(TargetArgs(), OutputArgs())(lambda target, as_json: None)
    assert own_params(grouped) == [] and list(inspect.signature(grouped).parameters) == [
        "target", "precision", "ep_option", "as_json"]
