"""`tune` on the CPU: a valid configuration inside the gate, one that `run` and `bench` accept."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench_helpers import cli, tune_cli

from onnxaccel.bench.accuracy import AccuracyGate
from onnxaccel.bench.config import ConfigError, load_config, save_config
from onnxaccel.bench.tune import TuneError, TuneSettings, tune
from onnxaccel.target import parse_target

FAST = ["--duration", "0.15", "--confirm-duration", "0.3", "--warmup", "3"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, mlp_path):
    out = tmp_path_factory.mktemp("tune")
    config = out / "mlp-tuned.json"
    proc = tune_cli("tune", str(mlp_path), "-t", "cpu", "-b", "1,8", "--threads", "1,2", *FAST, "-o", str(config),
                    "--report", str(out / "search.json"), "--report", str(out / "search.html"))
    assert proc.returncode == 0, proc.stderr
    return {"proc": proc, "config": config, "report": out / "search.json", "html": out / "search.html"}


def test_tune_writes_a_valid_config_with_provenance(tuned, mlp_path):
    config = load_config(tuned["config"])
    assert config.model == str(mlp_path) and config.target.device == "cpu" and config.batch in (1, 8)
    assert config.input_shapes == {"x": (config.batch, 4)} and config.concurrency == 1
    assert config.measured["throughput_items_per_s"] > 0 and config.measured["speedup_vs_plain"] > 0
    assert config.provenance["onnxruntime"] and config.provenance["command"].startswith("onnxaccel tune ")
    assert config.check_model(mlp_path) is None and len(config.model_sha256) == 64
    assert "configuration written to" in tuned["proc"].stdout and "onnxaccel bench --config" in tuned["proc"].stdout


def test_every_candidate_is_in_the_report_with_its_verdict(tuned):
    data = json.loads(tuned["report"].read_text())
    tune_section = data["tune"]
    stages = {row["stage"] for row in tune_section["candidates"]}
    assert {"batch 1: precision x IO binding", "batch 8: precision x IO binding"} <= stages
    assert any("threads" in s for s in stages)
    assert all(row["verdict"] == "valid" or row["status"] != "ok" or "budget" in row["verdict"]
               or "accuracy" in row["verdict"] for row in tune_section["candidates"])
    ids = {c["id"] for c in data["cells"]}
    assert tune_section["best"]["id"] in ids and tune_section["best"]["id"].endswith("|confirm")
    assert tune_section["baseline"]["id"] == f"cpu|batch={tune_section['best']['batch']}|io=off|c=1|confirm"
    assert "<svg" in tuned["html"].read_text() and "Tune" in tuned["html"].read_text()


def test_bench_and_run_accept_the_config(tuned, mlp_path):
    bench = cli("bench", "--config", str(tuned["config"]), "--runs", "20", "--json")
    assert bench.returncode == 0, bench.stderr
    cells = json.loads(bench.stdout)["cells"]
    config = load_config(tuned["config"])
    assert len(cells) == 1 and cells[0]["target"] == str(config.target) and cells[0]["batch"] == config.batch
    assert cells[0]["iobinding"] == config.iobinding
    run = cli("run", config.model, *config.cli_args(), "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["input_shapes"] == {"x": [config.batch, 4]}
    again = cli("bench", config.model, *config.cli_args(), "--runs", "5", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["cells"][0]["id"] == cells[0]["id"]


def test_the_accuracy_gate_rejects_what_is_not_accurate(mlp_path):
    result = tune(str(mlp_path), parse_target("cpu"), TuneSettings(
        batches=(4,), precisions=("fp32", "int8"), gate=AccuracyGate(max_error=0.0), duration=0.1,
        confirm_duration=0.1, warmup=2, threads=(1,)))
    verdicts = {row["id"]: row["verdict"] for row in result.candidates}
    assert all(v.startswith("outside the accuracy gate") for k, v in verdicts.items() if k.startswith("cpu/int8"))
    assert result.config.target.precision == "fp32"


def test_an_impossible_latency_budget_is_an_error_with_a_hint(tmp_path, mlp_path):
    proc = tune_cli("tune", str(mlp_path), "-t", "cpu", "--latency-budget", "0.000001", *FAST,
                    "-o", str(tmp_path / "c.json"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "No configuration" in proc.stderr and "raise --latency-budget" in proc.stderr
    assert json.loads((tmp_path / "c.report.json").read_text())["cells"]  # what was measured is kept
    assert not (tmp_path / "c.json").exists()


def test_tune_error_when_nothing_runs(mlp_path):
    with pytest.raises(TuneError) as err:
        tune(str(mlp_path), parse_target("cuda"), TuneSettings(duration=0.1, confirm_duration=0.1))
    assert "No configuration" in err.value.message and "failed to run" in err.value.hint


@pytest.mark.parametrize("content,message", [
    (None, "Configuration file not found"),
    ("{oops", "is not JSON"),
    ('{"schema": "onnxaccel.bench/2"}', "is not an onnxaccel configuration"),
    ('{"schema": "onnxaccel.config/1", "model": "m.onnx", "target": "cpu?prefer_nhwc=1"}', "is not valid here"),
    ('{"schema": "onnxaccel.config/1", "model": "m.onnx", "target": "cpu", "batch": 0}', "'batch' must be"),
    ('{"schema": "onnxaccel.config/1", "model": "m.onnx", "target": "cpu", "shapes": {"x": [1, -3]}}',
     "'shapes' must map"),
    ('{"schema": "onnxaccel.config/1", "target": "cpu"}', "'model' is missing"),
])
def test_bad_config_files_raise_clear_errors(tmp_path, content, message):
    path = tmp_path / "c.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert message in err.value.message and err.value.hint and err.value.exit_code == 2


def test_config_round_trips(tuned, tmp_path):
    config = load_config(tuned["config"])
    again = load_config(save_config(config, tmp_path / "copy.json"))
    assert again.to_dict() == config.to_dict()


def test_bench_with_a_bad_config_exits_2_without_traceback(tmp_path):
    (tmp_path / "bad.json").write_text('{"schema": "onnxaccel.config/1", "model": "m", "target": "gpu"}')
    proc = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", "bench", "--config", str(tmp_path / "bad.json")],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Unknown target device 'gpu'" in proc.stderr and "Traceback" not in proc.stderr


def test_the_instances_stage_is_tried_and_its_count_reaches_the_config(tmp_path, mlp_path):
    """On a CPU only when asked (sessions would share cores); the winner's instance count is written, and
    `bench --config` measures that many sessions."""
    config = tmp_path / "mlp-tuned.json"
    proc = tune_cli("tune", str(mlp_path), "-t", "cpu?intra_op_num_threads=1", "-b", "8", "--precision", "fp32",
                    "--instances", "2", *FAST, "-o", str(config), "--report", str(tmp_path / "search.json"))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "search.json").read_text())["tune"]["candidates"]
    tried = [r for r in rows if "instances" in r["stage"]]
    assert len(tried) == 1 and tried[0]["id"].endswith("|i=2") and tried[0]["status"] == "ok"
    saved = load_config(config)
    best = json.loads((tmp_path / "search.json").read_text())["tune"]["best"]
    assert saved.instances == (2 if "|i=2" in best["id"] else 1)
    forced = json.loads(config.read_text())
    forced["instances"] = 2
    config.write_text(json.dumps(forced))
    bench = cli("bench", "--config", str(config), "--runs", "5", "--json")
    assert bench.returncode == 0, bench.stderr
    assert json.loads(bench.stdout)["cells"][0]["id"].endswith("|i=2")
    forced["instances"] = 0
    config.write_text(json.dumps(forced))
    with pytest.raises(ConfigError, match="'instances' must be a positive integer"):
        load_config(config)
