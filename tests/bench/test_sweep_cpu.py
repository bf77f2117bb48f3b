"""Real sweeps on the CPU: every cell measured and judged, failing cells recorded, the sweep going on."""

from __future__ import annotations

import json

import pytest

from onnxaccel.bench.accuracy import AccuracyGate
from onnxaccel.bench.cells import SweepCell, grid
from onnxaccel.bench.sweep import Sweep, SweepSettings

LATENCY_KEYS = {"count", "mean_ms", "stddev_ms", "min_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p99_9_ms",
                "max_ms", "cv", "unstable"}


def test_every_cpu_cell_has_the_full_trtexec_grade_record(cpu_sweep):
    ok = [r for r in cpu_sweep["results"] if r.ok]
    assert len(ok) == 8  # cpu x {fp32, int8} x batch {1, 4} x io {on, off}
    for result in ok:
        data = result.to_dict()
        assert set(data["latency"]) == LATENCY_KEYS
        lat = data["latency"]
        assert lat["min_ms"] <= lat["p50_ms"] <= lat["p90_ms"] <= lat["p95_ms"] <= lat["p99_ms"] <= lat["p99_9_ms"] \
            <= lat["max_ms"]
        assert data["batch"] in (1, 4) and data["throughput_items_per_s"] > 0
        session = data["session"]  # session creation and first inference reported apart from steady state
        assert session["create_s"] > 0 and session["first_inference_ms"] > 0 and data["first_run_ms"] > 0
        assert session["providers"][0] == "CPUExecutionProvider" and "CPU took" in session["placement"]
        assert data["memory"]["rss_bytes"] > 0 and data["memory"]["peak_rss_bytes"] >= data["memory"]["rss_bytes"]
        assert data["roofline"]["flops_per_inference"] > 0 and data["roofline"]["achieved_tflops"] > 0
        assert data["roofline"]["peak_tflops"] is None  # no GPU spec for a CPU cell
        assert sum(data["histogram"]["counts"]) == lat["count"] and len(data["samples_ms"]) == lat["count"]
        if result.cell.iobinding:
            assert data["transfer"]["h2d_ms"] >= 0 and data["transfer"]["compute_ms"] == lat["p50_ms"]


def test_flops_scale_with_batch(cpu_sweep):
    flops = {r.batch: r.roofline["flops_per_inference"] for r in cpu_sweep["results"] if r.ok}
    # x[b,4] @ [4,8] and [b,8] @ [8,3]: 2 * b * (32 + 24) multiply-adds, plus bias-free elementwise ops
    assert flops[4] == 4 * flops[1]


def test_non_fp32_cells_are_judged_against_the_fp32_reference(cpu_sweep):
    for result in cpu_sweep["results"]:
        if not result.ok:
            continue
        accuracy = result.accuracy
        if result.cell.effective_target.precision == "fp32":
            assert accuracy["reference"] == "self"
        else:
            assert accuracy["reference"] == "cpu (fp32)" and accuracy["passed"] is True
            assert accuracy["max_abs"] < 0.05 and accuracy["outputs"][0]["name"] == "probs"
            assert {c["name"] for c in accuracy["checks"]} >= {"finite", "elementwise"}


def test_a_target_that_cannot_load_fails_its_cells_and_the_sweep_goes_on(cpu_sweep):
    failed = [r for r in cpu_sweep["results"] if not r.ok]
    assert failed and all(r.cell.effective_target.device == "cuda" for r in failed)
    for result in failed:
        assert result.error["stage"] == "prepare" and result.error["hint"]
        assert result.error["error"] in ("ProviderUnavailableError", "TargetError")
    # in the order the cells ran, working cells finished after the first failure
    done = [e.result for e in cpu_sweep["events"] if e.kind == "cell-done"]
    first_failure = next(i for i, r in enumerate(done) if not r.ok)
    assert any(r.ok for r in done[first_failure + 1:])
    assert len(done) == len(cpu_sweep["cells"])


def test_impossible_combinations_are_skipped_with_a_reason(cpu_sweep):
    reasons = {s.to_dict()["id"]: s.reason for s in cpu_sweep["skipped"]}
    assert "graph capture is not an option of CPUExecutionProvider" in reasons["cpu|batch=1|io=on|c=1|graph=on"]
    assert any("needs IO binding" in r for r in reasons.values())
    assert json.loads(cpu_sweep["paths"]["json"].read_text())["summary"]["skipped"] == len(reasons)


def test_a_batch_the_model_refuses_is_a_failed_cell_not_a_silent_rerun(fixed_batch_path):
    cells = [SweepCell("cpu", 1), SweepCell("cpu", 3), SweepCell("cpu", 1, iobinding=False)]
    sweep = Sweep(str(fixed_batch_path), SweepSettings(warmup=2, runs=10))
    results = {r.id: r for r in sweep.run(cells)}
    refused = results["cpu|batch=3|io=on|c=1"]
    assert not refused.ok and refused.error["error"] == "ShapeError"
    assert "fixed first axis" in refused.error["message"] and "dynamic" in refused.error["hint"]
    assert results["cpu|batch=1|io=on|c=1"].ok and results["cpu|batch=1|io=off|c=1"].ok


def test_zoo_transformer_sweep_with_fp16_and_int8():
    cells, _ = grid(["cpu"], precisions=["fp32", "fp16", "int8"], batches=[2], shapes={"sequence": (16,)})
    sweep = Sweep("zoo:bert-tiny", SweepSettings(warmup=2, runs=10))
    results = {r.cell.effective_target.precision: r for r in sweep.run(cells)}
    assert all(r.ok for r in results.values()), {k: r.error for k, r in results.items()}
    assert results["fp32"].input_shapes == {"input_ids": [2, 16], "attention_mask": [2, 16],
                                            "token_type_ids": [2, 16]}
    for precision in ("fp16", "int8"):
        accuracy = results[precision].accuracy
        assert accuracy["passed"] is True and {o["name"] for o in accuracy["outputs"]} == {"last_hidden_state",
                                                                                            "pooler_output"}
    assert results["fp16"].roofline["flops_per_inference"] == results["fp32"].roofline["flops_per_inference"] > 0


def test_an_accuracy_gate_that_is_too_tight_fails_the_accuracy_not_the_timing(mlp_path):
    sweep = Sweep(str(mlp_path), SweepSettings(warmup=2, runs=10, gate=AccuracyGate(max_error=0.0)))
    result = sweep.run([SweepCell("cpu/int8", 2)])[0]
    assert result.ok and result.latency.count == 10
    assert result.accuracy["passed"] is False
    assert next(c for c in result.accuracy["checks"] if c["name"] == "max_error")["passed"] is False


def test_concurrent_requests_report_wall_throughput(mlp_path):
    sweep = Sweep(str(mlp_path), SweepSettings(warmup=2, runs=20))
    result = sweep.run([SweepCell("cpu", 2, concurrency=3)])[0]
    assert result.ok and result.latency.count == 60  # 20 calls on each of 3 threads
    assert result.timing["throughput_basis"] == "wall"
    assert result.throughput == pytest.approx(result.timing["wall_throughput_items_per_s"])


def test_instances_run_separate_sessions_side_by_side(mlp_path):
    sweep = Sweep(str(mlp_path), SweepSettings(warmup=2, runs=20))
    opened = []
    real = sweep._instances

    def spy(cell, prepared):
        extra = real(cell, prepared)
        opened.extend(id(r.session) for r in extra + [prepared.runner])
        return extra

    sweep._instances = spy
    result = sweep.run([SweepCell("cpu?intra_op_num_threads=1", 2, instances=3)])[0]
    assert result.ok and result.latency.count == 60  # 20 calls on each of 3 sessions
    assert result.id.endswith("|c=1|i=3") and result.timing["throughput_basis"] == "wall"
    # two further sessions, not the group's one three times; each its own ORT session
    assert len(set(opened)) == 3
    assert SweepCell.from_dict(result.cell.to_dict()) == result.cell


@pytest.mark.parametrize("iobinding", [False, True])
def test_each_instance_thread_calls_its_own_session(mlp_path, iobinding):
    from onnxaccel.bench.concurrency import measure_concurrent
    from onnxaccel.pipeline import prepare
    from onnxaccel.target import parse_target

    preps = [prepare(str(mlp_path), parse_target("cpu?intra_op_num_threads=1"), batch=2) for _ in range(3)]
    counts = [0, 0, 0]
    for i, p in enumerate(preps):
        # The pool checks the feeds once and then runs unchecked (engines/base.py's runner template).
        real_run, real_bind = p.runner.run_unchecked, p.runner.bind

        def run(feeds, i=i, real_run=real_run):
            counts[i] += 1
            return real_run(feeds)

        def bind(feeds, i=i, real_bind=real_bind):
            bound = real_bind(feeds)
            real = bound.run

            def counted():
                counts[i] += 1
                return real()

            bound.run = counted
            return bound

        p.runner.run_unchecked, p.runner.bind = run, bind
    timing = measure_concurrent([p.runner for p in preps], preps[0].feeds, concurrency=3, batch=2, warmup=2, runs=5,
                                iobinding=iobinding)
    assert counts == [7, 7, 7]  # 2 warm-up (one instance after the other) + 5 timed calls each
    assert timing.latency.count == 15 and set(timing.outputs()) == {"probs"}
    for p in preps:
        p.close()
