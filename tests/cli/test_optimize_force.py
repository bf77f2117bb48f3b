"""`optimize` refuses to replace an existing --output without --force, as --force's help says (issue 23)."""

from __future__ import annotations

import hashlib

from typer.testing import CliRunner

from onnxaccel.cli.main import app
from tests.model_builders import make_mlp

runner = CliRunner()


def test_an_earlier_output_is_kept_unless_forced(tmp_path):
    model = make_mlp(tmp_path / "mlp.onnx")
    out = tmp_path / "mlp.opt.onnx"
    first = runner.invoke(app, ["optimize", str(model), "-o", str(out), "-t", "cpu", "--no-compile-cache"])
    assert first.exit_code == 0, first.output
    before = hashlib.sha256(out.read_bytes()).hexdigest()
    again = runner.invoke(app, ["optimize", str(model), "-o", str(out), "-t", "cpu", "--no-compile-cache",
                                "--opset", "18"])
    said = " ".join(again.output.split())
    assert again.exit_code == 2 and "Traceback" not in said
    assert f"--output {out} already exists" in said and "Pass --force to overwrite it" in said
    assert hashlib.sha256(out.read_bytes()).hexdigest() == before  # untouched
    forced = runner.invoke(app, ["optimize", str(model), "-o", str(out), "-t", "cpu", "--no-compile-cache",
                                 "--opset", "18", "--force"])
    assert forced.exit_code == 0, forced.output
    assert hashlib.sha256(out.read_bytes()).hexdigest() != before


def test_help_of_force_says_what_it_overwrites():
    result = runner.invoke(app, ["optimize", "--help"], env={"COLUMNS": "200"})
    assert "Overwrite --output when it exists" in " ".join(result.output.split())
