"""Argument groups: one precedence rule (an option given > the --config file > the default) for run, bench, serve
and batch, proven on each command as users run it, and on the groups themselves."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from onnxaccel.bench.config import load_config
from onnxaccel.cli.groups import (
    Inputs, ModelArgs, Reports, Timing, batches, build_target, build_targets, instance_count, iobinding,
    iobinding_modes, ints, modes, pick,
)
from onnxaccel.cli.main import app
from onnxaccel.engines import best_target
from onnxaccel.errors import UsageError
from tests.scale.conftest import write_npy_shards
from tests.serve.conftest import SERVE

runner = CliRunner()

#: What the configuration says; every value differs from the command's default and from the flags below.
TUNED = {"target": "cpu?intra_op_num_threads=1", "batch": 3, "iobinding": False, "instances": 2}


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def auto() -> str:
    """What `--target auto` (the default) resolves to on this machine."""
    return str(best_target()[0])


@pytest.fixture
def tuned(tmp_path, mlp_path):
    """A `tune` configuration of the test MLP, as `tune --output` writes it (the fields the commands read)."""
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"schema": "onnxaccel.config/1", "model": str(mlp_path), **TUNED}))
    return path


def _with_shapes(tuned, tmp_path):
    """The configuration, binding the MLP's symbolic dim 'batch' to 5 (a shape binding wins over its batch)."""
    path = tmp_path / "shaped.json"
    path.write_text(json.dumps({**json.loads(tuned.read_text()), "shapes": {"batch": [5]}}))
    return path


# -- the groups -----------------------------------------------------------------------------------------

def test_pick_takes_the_flag_then_the_config_then_the_default():
    assert pick("flag", "config", "default") == "flag"
    assert pick(None, "config", "default") == "config"
    assert pick(None, None, "default") == "default"
    assert pick(False, True, True) is False  # a flag given as off is given


def test_model_args_flag_replaces_the_config_which_replaces_the_default(tmp_path, tuned, mlp_path):
    config = load_config(_with_shapes(tuned, tmp_path))
    given = ModelArgs.resolve(None, shape=["sequence=7"], batch=2, tuned=config)
    assert (given.source, given.shapes, given.batch) == (str(mlp_path), {"sequence": (7,)}, 2)
    from_config = ModelArgs.resolve("other.onnx", shape=None, batch=None, tuned=config)
    assert (from_config.source, from_config.shapes, from_config.batch) == ("other.onnx", {"batch": (5,)}, 3)
    replaced = ModelArgs.resolve(None, shape=["sequence=7"], batch=None, tuned=config)
    assert replaced.shapes == {"sequence": (7,)}  # a --shape given replaces all of the configuration's shapes
    plain = ModelArgs.resolve("m.onnx", shape=None, batch=None, tuned=None)
    assert (plain.shapes, plain.batches) == ({}, (None,))
    assert ModelArgs.resolve(None, shape=None, batch=["1,8", "8", "32"], tuned=config).batches == (1, 8, 32)
    with pytest.raises(UsageError, match="No model given"):
        ModelArgs.resolve(None, shape=None, batch=None, tuned=None)


def test_target_flag_then_config_then_auto_with_precision_and_options_on_top(tuned, auto):
    config = load_config(tuned)
    assert str(build_target("cpu", None, None, config)) == "cpu"
    assert str(build_target("auto", None, None, config)) == auto  # an explicit auto is given, not the default
    assert str(build_target(None, "int8", ["intra_op_num_threads=2"], config)) == "cpu/int8?intra_op_num_threads=2"
    assert str(build_target(None, None, None, None)) == auto
    assert [str(t) for t in build_targets(["cpu", "cpu/int8"], None, config)] == ["cpu", "cpu/int8"]
    assert [str(t) for t in build_targets(None, None, config)] == [TUNED["target"]]
    assert [str(t) for t in build_targets(None, None, None)] == [auto]


def test_iobinding_instances_and_timing_follow_the_same_rule(tuned):
    config = load_config(tuned)
    assert (iobinding(True, config), iobinding(None, config), iobinding(None, None)) == (True, False, True)
    assert iobinding_modes("both", False, config) == [True, False]
    assert iobinding_modes(None, False, config) == [False] and iobinding_modes(None, False, None) == [True]
    assert iobinding_modes(None, True, None) == [False]  # the hidden --no-iobinding
    assert (instance_count(3, config), instance_count(None, config), instance_count(None, None)) == (3, 2, 1)
    timing = dict(warmup=1, runs=None, duration=None, calls_per_sample=None, concurrency="1,2")
    assert Timing.resolve(**timing, instances="4", tuned=config).instances == (4,)
    assert Timing.resolve(**timing, instances=None, tuned=config).instances == (2,)
    plain = Timing.resolve(**timing, instances=None, tuned=None)
    assert (plain.instances, plain.concurrency, plain.runs) == ((1,), (1, 2), 100)
    with pytest.raises(UsageError, match="exclude each other"):
        Timing.resolve(**{**timing, "runs": 5, "duration": 1.0}, instances=None, tuned=None)


def test_parsing_helpers_name_the_option_in_their_errors(tmp_path):
    assert ints("8, 1,8", "--threads") == [8, 1] and batches(["1,8", "32"]) == [1, 8, 32]
    assert modes("Both", "--graph") == [True, False]
    for call, message in ((lambda: ints("0", "--threads"), "--threads takes positive integers"),
                          (lambda: ints(",", "--instances"), "--instances is empty"),
                          (lambda: modes("maybe", "--graph"), "--graph takes on, off or both")):
        with pytest.raises(UsageError, match=message):
            call()
    assert Inputs.resolve(["x=1"], ["0,1"], 3) == Inputs(("x=1",), {"": (0.0, 1.0)}, 3)
    with pytest.raises(UsageError, match="--resume needs the JSON report"):
        Reports.resolve([str(tmp_path / "r.md")], resume=True)
    tuned_reports = Reports.resolve([str(tmp_path / "r.md")], resume=False, default_json=tmp_path / "o.json")
    assert tuned_reports.json_path == tmp_path / "o.json" and tuned_reports.previous() is None


# -- the commands: flag > config > default, as users run them -------------------------------------------

def test_run_flag_beats_config_beats_default(tmp_path, tuned, mlp_path, auto):
    """Before the groups, `run` let the configuration's IO binding win over --iobinding/--no-iobinding, and took
    an explicit `--target auto` for "not given"."""
    shaped = _with_shapes(tuned, tmp_path)
    cases = [
        ([], (auto, True, [1, 4])),
        (["--config", str(tuned)], (TUNED["target"], False, [3, 4])),
        (["--config", str(tuned), "--target", "auto", "--iobinding", "--batch", "2"], (auto, True, [2, 4])),
        (["--config", str(shaped)], (TUNED["target"], False, [5, 4])),
        (["--config", str(shaped), "--shape", "batch=6"], (TUNED["target"], False, [6, 4])),
    ]
    for args, expected in cases:
        result = invoke("run", str(mlp_path), *args, "--json")
        assert result.exit_code == 0, result.stderr
        out = json.loads(result.stdout)
        assert (out["target"], out["iobinding"], out["input_shapes"]["x"]) == expected, args


def test_bench_flag_beats_config_beats_default(tuned, mlp_path, auto):
    cases = [
        ([str(mlp_path)], (auto, 1, True, 1)),
        (["--config", str(tuned)], (TUNED["target"], 3, False, 2)),
        (["--config", str(tuned), "-t", "auto", "-b", "2", "--iobinding", "on", "--instances", "1"],
         (auto, 2, True, 1)),
    ]
    for args, expected in cases:
        result = invoke("bench", *args, "--runs", "3", "--warmup", "1", "--no-telemetry", "--json")
        assert result.exit_code == 0, result.stderr
        cell = json.loads(result.stdout)["cells"][0]
        assert (cell["target"], cell["batch"], cell["iobinding"], cell["cell"]["instances"]) == expected, args


def test_batch_flag_beats_config_beats_default(tmp_path, tuned, mlp_path, auto):
    """Before the groups, `batch` took an explicit `--target auto` for "not given" (the configuration's target
    won) and merged --shape into the configuration's shapes instead of replacing them."""
    data = write_npy_shards(tmp_path / "npy", shards=1, rows=6, row_shape=(4,))
    cases = [
        ([], (auto, 8)),
        (["--config", str(tuned)], (TUNED["target"], 3)),
        (["--config", str(tuned), "--target", "auto", "--batch", "2"], (auto, 2)),
    ]
    for index, (args, expected) in enumerate(cases):
        result = invoke("batch", str(mlp_path), "--input", str(data), "--output", str(tmp_path / f"out{index}"),
                        *args, "--json")
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout)
        assert (report["target"], report["batch"]) == expected, args


def _serve(source, *args: str, timeout: float = 90):
    """`onnxaccel serve SOURCE ARGS --json` on a free port: its ready event, then the served model's Triton
    configuration (None when it did not load); SIGTERM after."""
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "serve", str(source), "--http-port", "0", "--no-grpc",
                             *args, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        deadline, line = time.monotonic() + timeout, ""
        while not line and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                line = proc.stdout.readline()
        assert line, f"no ready event: {proc.stderr.read() if proc.poll() is not None else 'timed out'}"
        event = json.loads(line)
        model = event["models"][0]
        config = None
        if model["state"] == "READY":
            config = httpx.get(f"{event['http_url']}/v2/models/{model['name']}/config", timeout=10).json()
        return model, config
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_serve_flag_beats_config_beats_default(tmp_path, mlp_path):
    """Before the groups, `serve` took the configuration's target even with --target given. The configuration
    here names MIGraphX, which neither the CPU nor the CUDA build of ONNX Runtime includes: a model it reaches
    does not load, which shows which target won."""
    import onnxruntime

    if "MIGraphXExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this ONNX Runtime has MIGraphX: a model on the configuration's target would load too")
    config = tmp_path / "tuned.json"
    config.write_text(json.dumps({"schema": "onnxaccel.config/1", "model": str(mlp_path), "target": "migraphx",
                                  "instances": 2}))
    cpu_config = tmp_path / "cpu.json"
    cpu_config.write_text(json.dumps({"schema": "onnxaccel.config/1", "model": str(mlp_path), "target": "cpu",
                                      "instances": 2}))
    model, served = _serve(mlp_path)
    assert model["state"] == "READY" and served["instance_group"][0]["count"] == 1  # the defaults
    model, _ = _serve(mlp_path, "--config", str(config), "--allow-unavailable")
    assert model["state"] == "UNAVAILABLE" and "MIGraphX" in model["reason"]  # the configuration's target
    model, served = _serve(mlp_path, "--config", str(cpu_config))
    assert model["state"] == "READY" and served["instance_group"][0]["count"] == 2  # its instance count
    model, served = _serve(mlp_path, "--config", str(config), "--target", "cpu", "--instances", "3")
    assert model["state"] == "READY", model  # the flags win
    assert served["instance_group"][0]["count"] == 3


def test_serve_arena_flags_reach_the_model_defaults_and_the_providers_own_keys():
    """--arena-extend-strategy/--gpu-mem-limit are generic flags: SessionArgs hands them over under ModelConfig's
    names, and the plan spells them as each provider's arena keys (ProviderSpec.arena_keys)."""
    from types import SimpleNamespace

    from onnxaccel.cli.args_serve import SessionArgs
    from onnxaccel.plan import PlanRequest, plan_execution
    from onnxaccel.serve.config import model_defaults
    from onnxaccel.target import parse_target

    session = SessionArgs().build(SimpleNamespace(arena_strategy="kSameAsRequested", arena_limit=1 << 30,
                                                  arena_shrinkage=False, session_per_batch_size=True), None)
    defaults = model_defaults({"target": "migraphx", **session})
    assert (defaults.arena_extend_strategy, defaults.gpu_mem_limit) == ("kSameAsRequested", 1 << 30)
    plan = plan_execution(parse_target("migraphx"), PlanRequest(
        command="serve", max_batch=8, workers=1, arena_extend_strategy=defaults.arena_extend_strategy,
        gpu_mem_limit=defaults.gpu_mem_limit))
    options = plan.target.provider_options()
    assert options["migraphx_arena_extend_strategy"] == "kSameAsRequested"
    assert options["migraphx_mem_limit"] == str(1 << 30)
