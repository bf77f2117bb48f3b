"""One short flag, one meaning, across every command; the old spellings still work for a release, with a note."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import typer.main
from typer.testing import CliRunner

from onnxaccel.cli.flags import DEPRECATED
from onnxaccel.cli.main import app
from tests.model_builders import make_mlp

runner = CliRunner()


def commands(command=None, path=()):
    """(path, click command) for every command and subcommand of the app."""
    command = command or typer.main.get_command(app)
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from commands(sub, (*path, name))
    if path:
        yield " ".join(path), command


def short_flag_meanings() -> dict[str, dict[str, list[str]]]:
    """short flag -> the long option it stands for -> the commands where it does."""
    meanings: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, command in commands():
        for param in (p for p in command.params if p.param_type_name == "option"):
            for opts in (getattr(param, "opts", []), getattr(param, "secondary_opts", [])):
                longs = [o for o in opts if o.startswith("--")] or [param.name]
                for short in (o for o in opts if not o.startswith("--")):
                    meanings[short][longs[0]].append(name)
    return meanings


def test_every_short_flag_has_one_meaning_across_all_commands():
    meanings = short_flag_meanings()
    clashes = {flag: dict(m) for flag, m in meanings.items() if len(m) > 1}
    assert not clashes, clashes
    assert set(meanings["-o"]) == {"--output"} and set(meanings["-i"]) == {"--input"}
    for name, command in commands():
        for param in command.params:
            if "--ep-option" in getattr(param, "opts", []):
                assert param.opts == ["--ep-option"], f"{name} --ep-option has a short flag: {param.opts}"
    for flag, long in (("-c", "--concurrency"), ("-n", "--nodes"), ("-x", "--fail-fast")):
        assert set(meanings[flag]) == {long}


def _output_flags() -> dict[str, list[str]]:
    return {name: p.opts for name, command in commands() for p in command.params
            if "--output" in getattr(p, "opts", [])}


def test_output_is_dash_o_in_optimize_tune_and_zoo_get():
    outputs = _output_flags()
    for name in ("optimize", "tune", "zoo get"):
        assert "-o" in outputs[name], (name, outputs[name])


def test_output_is_dash_o_in_every_command_and_dash_capital_o_is_gone():
    outputs = _output_flags()
    assert all("-o" in opts for opts in outputs.values()), outputs
    assert "-O" not in short_flag_meanings()


def test_every_deprecated_spelling_names_a_real_long_option_of_its_command():
    by_name = dict(commands())
    for name, old in DEPRECATED.items():
        longs = {o for p in by_name[name].params for o in (*getattr(p, "opts", []), *getattr(p, "secondary_opts", []))}
        for flag, long in old.items():
            assert long in longs, f"{name}: {flag} -> {long}, which {name} does not have"


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return make_mlp(tmp_path_factory.mktemp("flags") / "mlp.onnx")


def test_old_dash_o_still_sets_a_provider_option_with_a_deprecation_note(mlp):
    old = runner.invoke(app, ["run", str(mlp), "-t", "cpu", "-o", "intra_op_num_threads=1", "--json"])
    assert old.exit_code == 0, old.output
    assert "deprecated" in old.stderr and "--ep-option" in old.stderr
    new = runner.invoke(app, ["run", str(mlp), "-t", "cpu", "--ep-option", "intra_op_num_threads=1", "--json"])
    assert new.exit_code == 0 and "deprecated" not in new.stderr
    assert json.loads(old.stdout)["target"] == json.loads(new.stdout)["target"]
    # and the option really reached the session: an unknown key is refused the same way both ways
    bad_old = runner.invoke(app, ["run", str(mlp), "-t", "cpu", "-o", "no_such_key=1"])
    bad_new = runner.invoke(app, ["run", str(mlp), "-t", "cpu", "--ep-option", "no_such_key=1"])
    assert bad_old.exit_code == bad_new.exit_code == 2 and "no_such_key" in bad_old.output


def test_old_spellings_of_loadtest_protocol_and_monitor_still_parse_with_a_note():
    # an unreachable server: the point is that -i parses as --protocol (a bad value is refused by name)
    result = runner.invoke(app, ["loadtest", "http://127.0.0.1:9", "-m", "mlp", "-i", "carrier-pigeon"])
    assert "deprecated" in result.stderr and "--protocol" in result.stderr
    assert "No such option" not in result.output
    result = runner.invoke(app, ["monitor", "-i", "0"])
    assert result.exit_code == 2 and "deprecated" in result.stderr and "--interval" in result.output + result.stderr


def test_tune_dash_capital_o_is_still_the_output_and_dash_o_with_a_key_is_explained(mlp, tmp_path):
    result = runner.invoke(app, ["tune", str(mlp), "-t", "cpu", "-o", "intra_op_num_threads=1"])
    assert result.exit_code == 2 and "--ep-option intra_op_num_threads=1" in " ".join(result.output.split())
    result = runner.invoke(app, ["tune", str(mlp), "-t", "cpu", "-O", str(tmp_path / "c.yaml")])
    assert result.exit_code == 2 and "must be a .json file" in " ".join(result.output.split())  # -O: --output
    assert "deprecated" in result.stderr
