"""Google's Magika, as its PyPI wheel ships it (issue 38: a test per item on a real model of its kind).

Magika 1.0.3's standard_v3_3 takes bytes[N, 2048] int32: byte values 0..255 and the padding token 256, made
one-hot by Reshape -> Expand -> Equal against a constant [1, 1, 257] holding 0..256 (JAX's one_hot through
tf2onnx), then a Dense layer of 257 rows. A value of 257 or more matches no row: its one-hot row is all zeros,
an input the model never saw. Item 15 (tests/core/test_synthesis_ranges.py builds its own byte embedding as a
Gather) asks for values within those 257 rows. The output is [N, 214] probabilities from a softmax spelled out
as Exp / ReduceSum / Div, without class names in the model (they are in config.min.json beside it).
"""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from onnxaccel.cli.main import app
from onnxaccel.pipeline import prepare
from onnxaccel.target import parse_target

CPU = parse_target("cpu")


def _run_json(*args) -> dict:
    result = CliRunner().invoke(app, ["run", *map(str, args), "-t", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_synthesized_bytes_stay_within_the_257_one_hot_rows(magika_model):
    """Every synthesized byte value lies in [0, 257) (and uses most of it), and `run` says so and why."""
    prepared = prepare(str(magika_model), CPU, batch=2)
    values = prepared.feeds["bytes"]
    assert values.dtype == np.int32 and values.shape == (2, 2048)
    assert values.min() >= 0 and values.max() < 257, (int(values.min()), int(values.max()))
    assert values.max() > 200  # the byte range, not a small default
    detail = _run_json(magika_model)["inputs"][0]["detail"]
    assert detail.startswith("integers in [0, 257)") and "default range" not in detail, detail


def test_run_on_real_byte_values_gives_probabilities_and_explicit_topk(magika_model):
    """With the bytes in range (--value-range), the [N, 214] output is a probability per class; the default
    post-processing names why it shows no top-k (no Softmax node: the softmax is spelled out), and
    `--postprocess topk` ranks the classes by those probabilities, without labels."""
    default = _run_json(magika_model, "--value-range", "bytes=0,256", "-b", "2")
    output = default["outputs"][0]
    assert output["name"] == "target_label" and output["shape"] == [2, 214]
    assert output["nan"] == 0 and output["inf"] == 0 and 0 <= output["min"] and output["max"] <= 1
    assert default["postprocess"]["kind"] == "none"
    assert "Softmax" in default["postprocess"]["origin"]
    ranked = _run_json(magika_model, "--value-range", "bytes=0,256", "-b", "2", "--postprocess", "topk")
    post = ranked["postprocess"]
    assert post["kind"] == "topk" and post["output"] == "target_label" and post["params"] == {"k": 5}
    assert len(post["topk"]) == 2
    for row in post["topk"]:
        scores = [entry["score"] for entry in row]
        assert len(row) == 5 and scores == sorted(scores, reverse=True) and sum(scores) <= 1 + 1e-5
        assert all(0 <= entry["index"] < 214 and entry["label"] is None for entry in row)
        # Rows that already sum to 1 are taken as probabilities as they are.
        assert all(abs(entry["probability"] - entry["score"]) < 1e-6 for entry in row)
