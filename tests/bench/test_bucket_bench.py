"""`bench --shape-buckets` / `--shape-sweep` on real CPU sessions of zoo:bert-tiny, and the tune configuration's
``shape_buckets`` field (written, read back, used by bench --config)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from onnxaccel.bench.config import ConfigError, TunedConfig, load_config, save_config
from onnxaccel.cli.main import app
from onnxaccel.target import parse_target

runner = CliRunner()
FAST = ("--runs", "3", "--warmup", "1")


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "80"})


def test_shape_sweep_json_has_compile_warm_and_latency_per_bucket():
    result = invoke("bench", "zoo:bert-tiny", "-t", "cpu", "--shape-buckets", "sequence=16,32,64", "--shape-sweep",
                    *FAST, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "onnxaccel.bucket-bench/1" and report["shape_sweep"] is True
    rows = report["rows"]
    assert [r["bucket"] for r in rows] == ["sequence=16", "sequence=32", "sequence=64"]
    assert [r["feed"] for r in rows] == [{"sequence": 16}, {"sequence": 32}, {"sequence": 64}]
    for row in rows:
        assert row["warm_seconds"] > 0 and row["compile_seconds"] >= 0 and row["latency"]["p50_ms"] > 0
        assert row["latency"]["count"] == 3
    assert sum(r["compile_seconds"] for r in rows) > 0  # the CPU's one session, recorded on its bucket
    assert len({r["cache_digest"] for r in rows}) == 3  # each bucket its own compile-cache entry


def test_given_size_runs_through_its_bucket_and_the_table_fits_80_columns():
    result = invoke("bench", "zoo:bert-tiny", "-t", "cpu", "--shape-buckets", "sequence=16,32,64",
                    "--shape", "sequence=20", *FAST)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    row = next(line for line in lines if "sequence=32" in line)
    assert "20" in row and "sequence=16" not in result.stdout.split("buckets", 1)[1].split("\n", 1)[1]


def test_a_size_that_fits_no_bucket_is_a_clean_error():
    result = invoke("bench", "zoo:bert-tiny", "-t", "cpu", "--shape-buckets", "sequence=16,32",
                    "--shape", "sequence=40", *FAST)
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "fits no shape bucket" in text and "sequence=16,32" in text
    assert "Traceback" not in result.output


@pytest.mark.parametrize("args,message", [
    (("--shape-sweep",), "--shape-sweep needs --shape-buckets"),
    (("--shape-buckets", "sequence=16", "-t", "cpu", "-t", "cpu/int8"), "one target"),
    (("--shape-buckets", "length=16"), "no input of the model has as a symbolic dim"),
    (("--shape-buckets", "sequence=abc"), "is not a size"),
])
def test_bad_bucket_options_say_how_to_fix(args, message):
    result = invoke("bench", "zoo:bert-tiny", *args, *FAST)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output


def test_config_round_trips_shape_buckets(tmp_path):
    config = TunedConfig(model="zoo:bert-tiny", target=parse_target("cpu"), shape_buckets="sequence=16,32")
    path = save_config(config, tmp_path / "tuned.json")
    assert json.loads(path.read_text())["shape_buckets"] == "sequence=16,32"
    loaded = load_config(path)
    assert loaded.shape_buckets == "sequence=16,32"
    assert loaded.cli_args()[-2:] == ["--shape-buckets", "sequence=16,32"]


def test_config_with_bad_shape_buckets_is_refused(tmp_path):
    path = save_config(TunedConfig(model="zoo:bert-tiny", target=parse_target("cpu")), tmp_path / "t.json")
    data = json.loads(path.read_text())
    data["shape_buckets"] = "sequence="
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="shape_buckets"):
        load_config(path)


def test_bench_with_config_uses_its_shape_buckets(tmp_path):
    path = save_config(TunedConfig(model="zoo:bert-tiny", target=parse_target("cpu"),
                                   shape_buckets="sequence=16,32"), tmp_path / "tuned.json")
    result = invoke("bench", "--config", str(path), "--shape", "sequence=10", *FAST, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["shape_buckets"]["text"] == "sequence=16,32"
    assert [r["bucket"] for r in report["rows"]] == ["sequence=16"]
