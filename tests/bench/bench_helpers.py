"""Helpers for the bench tests: the CLI as a real process."""

from __future__ import annotations

import os
import subprocess
import sys


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`onnxaccel ...` as users run it: a real process."""
    return subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", *args], check=False, capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200"}, timeout=timeout)


TUNE_APP = """
import typer
from onnxaccel.cli import bench, tune
from onnxaccel.cli.common import STATE
app = typer.Typer(pretty_exceptions_enable=False)
@app.callback()
def root(debug: bool = typer.Option(False, "--debug")):
    STATE["debug"] = debug
tune.register(app)
bench.register(app)
app()
"""


def tune_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`onnxaccel tune ...` through a local app until cli/main.py registers the command."""
    return subprocess.run([sys.executable, "-c", TUNE_APP, *args], check=False, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=timeout)
