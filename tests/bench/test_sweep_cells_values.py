"""Sweep cells keep their target as a value (parsed once, not on every property), and a sweep converts and
draws feeds once per session: instances and the FP32 reference reuse the group's bound model and feeds."""

from __future__ import annotations

from onnxaccel import pipeline
from onnxaccel.bench import cells
from onnxaccel.bench.cells import SweepCell, grid
from onnxaccel.bench.sweep import Sweep, SweepSettings
from onnxaccel.target import parse_target


def test_a_cell_parses_its_target_text_once(monkeypatch):
    calls = []
    real = cells.parse_target
    monkeypatch.setattr(cells, "parse_target", lambda *a, **k: calls.append(a) or real(*a, **k))
    cell = SweepCell("cpu?intra_op_num_threads=1", 2, graph=True)
    for _ in range(5):
        assert cell.effective_target.device == "cpu" and not cell.uses_graph
        assert cell.id.startswith("cpu?intra_op_num_threads=1|batch=2") and cell.session_key[0] == cell.target
        assert cell.to_dict()["target"] == "cpu?intra_op_num_threads=1"
    assert len(calls) == 1
    given = parse_target("cpu/int8")
    assert SweepCell(given, 1).target is given and len(calls) == 1  # a Target is kept as it is
    assert SweepCell.from_dict(cell.to_dict()) == cell


def test_grid_cells_hold_the_targets_it_parsed(monkeypatch):
    made, _ = grid(["cpu"], precisions=["fp32", "int8"], batches=[1])
    monkeypatch.setattr(cells, "parse_target", lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-parsed")))
    assert [str(c.effective_target) for c in made] == ["cpu", "cpu/int8"]
    assert [c.id for c in made] == ["cpu|batch=1|io=on|c=1", "cpu/int8|batch=1|io=on|c=1"]


def test_instances_and_the_reference_convert_and_draw_once(mlp_path, monkeypatch):
    converted, drawn = [], []
    real_convert, real_feeds = pipeline.convert_for_target, pipeline.prepare_feeds
    monkeypatch.setattr(pipeline, "convert_for_target", lambda m, t: converted.append(str(t)) or real_convert(m, t))
    monkeypatch.setattr(pipeline, "prepare_feeds", lambda *a, **k: drawn.append(1) or real_feeds(*a, **k))
    sweep = Sweep(str(mlp_path), SweepSettings(warmup=1, runs=5, telemetry=False, transfers=False))
    result = sweep.run([SweepCell("cpu/int8?intra_op_num_threads=1", 2, instances=2)])[0]
    assert result.ok and result.accuracy["reference"] == "cpu (fp32)"
    # one conversion for both instances, one compile of the FP32 reference; the feeds drawn once for all
    assert converted == ["cpu/int8?intra_op_num_threads=1", "cpu"] and drawn == [1]
