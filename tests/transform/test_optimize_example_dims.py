"""`optimize` without --shape on a transformer with [batch_size, sequence_length] inputs: the accuracy gate runs at
the example values `inspect` states (model_shapes.bind_examples), says so, and the written model stays dynamic.

Model: the zoo's BERT-tiny graph (zoo/bert.py, the PyTorch export layout of Hugging Face BERT) built here without
the zoo's dim defaults metadata, its dims renamed to batch_size/sequence_length as Hugging Face exports name them.
"""

from __future__ import annotations

import json

import onnx
import pytest

from onnxaccel.zoo.bert import BERT_TINY, build_bert

RENAMED = {"batch": "batch_size", "sequence": "sequence_length"}


@pytest.fixture(scope="module")
def bert_without_defaults(tmp_path_factory):
    model = build_bert(BERT_TINY, seed=0)
    for value in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in RENAMED:
                dim.dim_param = RENAMED[dim.dim_param]
    del model.metadata_props[:]
    path = tmp_path_factory.mktemp("models") / "bert.onnx"
    onnx.save(model, str(path))
    return path


def test_unbound_sequence_length_is_gated_at_inspects_example_value(invoke, bert_without_defaults, tmp_path):
    out = tmp_path / "bert.opt.onnx"
    result = invoke("optimize", bert_without_defaults, "-o", out, "-t", "cpu", "--no-compile-cache", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {(d["label"], d["example"]) for d in report["example_dims"]} == {("sequence_length", 128)}
    assert any("sequence_length=128" in n and "example values" in n for n in report["notes"])
    assert report["after"]["inputs"]["input_ids"] == ["batch_size", "sequence_length"]
    assert report["accuracy"]["status"] == "measured" and report["passed"]


def test_fix_shape_still_needs_every_dim_bound(invoke, bert_without_defaults, tmp_path):
    result = invoke("optimize", bert_without_defaults, "-o", tmp_path / "fixed.onnx", "-t", "cpu", "--fix-shape",
                    "--no-compile-cache")
    assert result.exit_code != 0 and "sequence_length" in result.output and "--shape" in result.output
