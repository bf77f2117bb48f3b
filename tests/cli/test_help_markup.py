"""Help texts render without markup loss (issue 23): the CLI renders help with Rich markup, which eats any
``[word]`` as a style tag (``pip install 'onnxaccel[optimize]'`` showed as ``'onnxaccel'``). Help texts write
such brackets escaped (``\\[``); this walks every command's help and renders every ``--help``."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from onnxaccel.cli.main import app

#: What Rich's markup parser takes as a tag (rich/markup.py RE_TAGS): "[" then a letter, #, / or @.
TAG = re.compile(r"(?<!\\)\[[a-z#/@][^\[\]]*\]")


def _commands(command, path=()):
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


def _texts(command):
    yield "the command's help", command.help or ""
    for param in command.params:
        yield f"option {param.name}", getattr(param, "help", None) or ""


def test_no_help_text_has_an_unescaped_bracket_tag():
    found = [f"{' '.join(path) or 'onnxaccel'}: {where}: {tag}" for path, command in COMMANDS
             for where, text in _texts(command) for tag in TAG.findall(text)]
    assert not found, "escape these as \\[ (Rich would eat them):\n" + "\n".join(found)


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "onnxaccel")
def test_every_escaped_bracket_survives_rendering(path):
    command = dict(COMMANDS)[path]
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())
    for where, text in _texts(command):
        for escaped in re.findall(r"\\(\[[^\[\]]*\])", text):
            assert escaped in shown, f"{where}: {escaped} is not shown"


def test_optimize_simplify_names_its_extra():
    result = CliRunner().invoke(app, ["optimize", "--help"], env={"COLUMNS": "400", "NO_COLOR": "1"})
    assert "'onnxaccel[optimize]'" in " ".join(result.output.split())
