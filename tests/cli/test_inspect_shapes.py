"""`inspect` without shapes on real pretrained models: example values, formulas, and placement shapes."""

from __future__ import annotations

import json

import onnx
import pytest
from typer.testing import CliRunner

from onnxaccel.analysis.graph_stats import graph_stats
from onnxaccel.cli.main import app
from onnxaccel.model import load_model

pytest.importorskip("onnxruntime")


def _inspect(*args: str):
    result = CliRunner().invoke(app, ["inspect", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_ppocr_det_without_shapes_reports_a_formula(pretrained_det):
    text = " ".join(_inspect(str(pretrained_det), "-n", "0").split())
    assert "at x[2]=640, x[3]=640 (example values; bind with --shape)" in text
    assert "flops: 4.77 GFLOP × (x[2]×x[3])/(640×640)" in text
    data = json.loads(_inspect(str(pretrained_det), "--json", "-n", "0"))
    shapes = data["shapes"]
    assert shapes["source"] == "example values"
    assert shapes["example_values"] == {"x[2]": 640, "x[3]": 640}
    flops = shapes["scaling"]["metrics"]["flops"]
    assert flops["kind"] == "monomial" and flops["exponents"] == {"x[2]": 1, "x[3]": 1}
    # the formula predicts a binding it never measured (320x480), within 1 %
    measured = graph_stats(load_model(pretrained_det).bind({"x": (1, 3, 320, 480)})).total_flops
    assert measured == pytest.approx(flops["value"] * (320 * 480) / (640 * 640), rel=0.01)


def test_silero_vad_without_shapes_states_its_example_values(silero_vad_model):
    data = json.loads(_inspect(str(silero_vad_model), "--json", "-n", "0"))
    assert data["shapes"]["example_values"] == {"input[1]": 128, "state[1]": 128}
    assert data["model"]["input_shapes"]["input"] == [1, 128]
    # its work is inside If bodies: FLOPs are a lower bound, and no formula is claimed for them
    assert data["shapes"]["scaling"]["metrics"]["flops"]["formula"] is None
    assert "example values" in _inspect(str(silero_vad_model), "-n", "0")


def test_static_yolo_needs_no_example_and_placement_says_its_shapes(yolo_model):
    data = json.loads(_inspect(str(yolo_model), "--json", "-n", "0", "-t", "cpu"))
    assert data["shapes"]["source"] == "resolved" and data["shapes"]["scaling"] is None
    assert data["placement_shapes"] == {"images": [1, 3, 640, 640]}
    assert "placement on cpu at images=1x3x640x640" in " ".join(_inspect(str(yolo_model), "-n", "0", "-t",
                                                                        "cpu").split())


def test_bert_sequence_is_fitted_as_a_quadratic(tmp_path):
    # The zoo's BERT layout without its dim defaults: `sequence` is free, attention makes the cost quadratic.
    proto = onnx.load(str(load_model("zoo:bert-tiny").path))
    kept = [p for p in proto.metadata_props if p.key != "onnxaccel.dim_defaults"]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    path = tmp_path / "bert.onnx"
    onnx.save(proto, str(path))
    data = json.loads(_inspect(str(path), "--json", "-n", "0"))
    flops = data["shapes"]["scaling"]["metrics"]["flops"]
    assert data["shapes"]["example_values"] == {"sequence": 128}
    assert flops["kind"] == "polynomial" and "×sequence²" in flops["formula"]
    c0, c1, c2 = flops["coefficients"]
    measured = graph_stats(load_model(path).bind({"sequence": (384,)})).total_flops
    assert measured == pytest.approx(c0 + c1 * 384 + c2 * 384 ** 2, rel=0.01)
