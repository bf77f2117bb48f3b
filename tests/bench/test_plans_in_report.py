"""Bench reports carry the execution plan of every session they prepared, and print it as "what will run"."""

from __future__ import annotations

import json

from onnxaccel.bench.report import BenchReport, load_report
from onnxaccel.bench.report_text import PLAN_WIDTH, plan_block


def _block(markdown: str) -> list[str]:
    lines = markdown.splitlines()
    start = lines.index("## What will run")
    assert lines[start + 2] == "```text"
    end = lines.index("```", start + 3)
    return lines[start + 3:end]


def test_the_report_holds_one_plan_per_prepared_session(cpu_sweep):
    data = cpu_sweep["sweep"].report.to_dict()
    plans = data["plans"]
    assert plans and all(p["schema"] == "onnxaccel.plan/1" and p["command"] == "bench" for p in plans)
    # The CPU sessions (fp32, int8 at batch 1 and 4) each have their plan; the CUDA target fails to prepare.
    assert {(p["target"], tuple(p["batch_sizes"])) for p in plans} >= {("cpu", (1,)), ("cpu", (4,)),
                                                                       ("cpu/int8", (1,)), ("cpu/int8", (4,))}
    assert len(plans) == len({json.dumps(p, sort_keys=True) for p in plans})  # each once
    assert all(p["choices"][0]["name"] == "target" for p in plans)


def test_the_json_report_round_trips_its_plans(cpu_sweep):
    report = load_report(cpu_sweep["paths"]["json"])
    assert report.plans == json.loads(json.dumps(cpu_sweep["sweep"].report.plans))


def test_a_report_written_before_plans_still_loads(cpu_sweep):
    data = json.loads(cpu_sweep["paths"]["json"].read_text())
    del data["plans"]
    assert BenchReport.from_dict(data).plans == []


def test_the_markdown_report_prints_what_will_run_before_the_tables(cpu_sweep):
    text = cpu_sweep["paths"]["md"].read_text()
    block = _block(text)
    assert text.index("## What will run") < text.index("| cell |")
    assert "cpu" in block and "  precision: fp32 (fp32: the model as it is)" in block
    assert any(line.startswith("  batch: 4") for line in block)
    assert all(len(line) <= PLAN_WIDTH for line in block)
    assert "What will run" in cpu_sweep["paths"]["html"].read_text()


def test_long_reasons_wrap_to_80_columns():
    plan = {"target": "cuda/fp16?enable_cuda_graph=1", "shapes": {"x": [4, 3, 224, 224]},
            "choices": [{"name": "target", "value": "cuda/fp16", "reason": "as given"},
                        {"name": "graph_capture", "value": True, "reason": "word " * 60},
                        {"name": "batch_sizes", "value": [1, 2, 4], "reason": "given"}]}
    report = BenchReport(model={}, environment={}, settings={}, plans=[plan])
    block = plan_block(report)
    assert block[0] == "cuda/fp16?enable_cuda_graph=1, x[4x3x224x224]"
    assert block[1].startswith("  graph_capture: on (word") and len(block) > 3
    assert "  batch_sizes: 1,2,4 (given)" in block
    assert all(len(line) <= 80 for line in block)
