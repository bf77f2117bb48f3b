"""`onnxaccel compile`: its --json (schema onnxaccel.compile/1) lists the artifacts it made with their keys, the
models it wrote pass the full ONNX check, a second compile keeps what is there, and `run` started with
ONNXACCEL_ARTIFACTS compiles nothing; `--for serve` prepares what a server loads."""

from __future__ import annotations

import json

import onnx
import pytest
from typer.testing import CliRunner

from onnxaccel.cli.main import app
from onnxaccel.engines.build_counts import build_counts, reset_build_counts
from onnxaccel.paths import ARTIFACTS_ENV


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(ARTIFACTS_ENV, raising=False)
    reset_build_counts()


def _compile(*args: str) -> dict:
    done = CliRunner().invoke(app, ["compile", *map(str, args), "--json"])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def test_compile_json_lists_checked_artifacts_and_run_then_loads_them(mlp_path, tmp_path):
    art = tmp_path / "art"
    result = _compile(mlp_path, "-t", "cpu", "-p", "fp16", "--for", "run", "-b", "2", "-o", art)
    assert result["schema"] == "onnxaccel.compile/1" and result["command"] == "run"
    assert result["plans"][0]["command"] == "run" and result["counts"]["compiled"] == 1
    kinds = {a["kind"]: a for a in result["artifacts"]}
    assert set(kinds) == {"variant", "ort-optimized"} and all(a["made"] for a in result["artifacts"])
    key = kinds["ort-optimized"]["key"]
    assert key["target"] == "cpu/fp16" and key["shapes"] == {"x": [2, 4]} and "onnxruntime" in key["runtime"]
    assert kinds["ort-optimized"]["variant"] == kinds["variant"]["id"]
    for artifact in result["artifacts"]:
        assert artifact["size_bytes"] > 0 and artifact["seconds"] >= 0
        onnx.checker.check_model(str(art / artifact["files"][0]), full_check=True)
    again = _compile(mlp_path, "-t", "cpu", "-p", "fp16", "--for", "run", "-b", "2", "-o", art)
    assert not any(a["made"] for a in again["artifacts"]) and again["counts"]["loaded"] == 1

    reset_build_counts()
    done = CliRunner().invoke(app, ["run", str(mlp_path), "-t", "cpu", "-p", "fp16", "-b", "2", "--json"],
                              env={ARTIFACTS_ENV: str(art)})
    assert done.exit_code == 0, done.output
    assert build_counts() == {"sessions": 1, "compiled": 0, "loaded": 1}
    refused = CliRunner().invoke(app, ["run", str(mlp_path), "-t", "cpu", "-b", "3"], env={ARTIFACTS_ENV: str(art)})
    assert refused.exit_code == 1 and "has no ONNX Runtime optimized model" in " ".join(refused.output.split())


def test_compile_for_serve_prepares_what_the_server_loads(mlp_path, tmp_path):
    from onnxaccel.engines import artifacts
    from onnxaccel.serve.config import model_config_from, model_defaults
    from onnxaccel.serve.repository import load_instance

    result = _compile(mlp_path, "-t", "cpu", "-o", tmp_path / "art")
    assert result["command"] == "serve" and result["plans"][0]["command"] == "serve"
    reset_build_counts()
    # serve's defaults for a CPU target (cli/serve.py: max_batch 8, instances as planned)
    defaults = model_defaults({"target": "cpu", "max_batch": 8, "instances": 3})
    with artifacts.use(tmp_path / "art"):
        load_instance(model_config_from("mlp", str(mlp_path), defaults, None)).close()
    assert build_counts() == {"sessions": 3, "compiled": 0, "loaded": 3}


def test_compile_text_is_a_table_of_the_artifacts(mlp_path, tmp_path):
    done = CliRunner().invoke(app, ["compile", str(mlp_path), "-t", "cpu", "--for", "batch", "-o",
                                    str(tmp_path / "art")], env={"COLUMNS": "80"})
    assert done.exit_code == 0, done.output
    assert "ort-optimized-" in done.output and "made" in done.output
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    unknown = CliRunner().invoke(app, ["compile", str(mlp_path), "--for", "tune", "-o", str(tmp_path / "x")])
    assert unknown.exit_code == 2 and "--for tune" in unknown.output
