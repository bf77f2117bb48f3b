"""`onnxaccel loadtest --shape-mix`: mixed-length requests against a real server serving BERT with sequence
buckets; lengths past the largest bucket come back as 400s, counted as errors."""

from __future__ import annotations

import json

import httpx
import pytest

from onnxaccel.errors import UsageError
from onnxaccel.loadtest.generator import make_input_mix, parse_shape_mix
from tests.loadtest.test_loadtest import run_loadtest
from tests.serve.conftest import ServerProcess


@pytest.fixture(scope="module")
def bucketed_bert(tmp_path_factory):
    proc = ServerProcess("zoo:bert-tiny", "--shape-buckets", "sequence=16,32,64", "--max-queue-delay-ms", "5",
                         log=tmp_path_factory.mktemp("logs") / "bert.log")
    try:
        yield proc.wait_ready(120)
    finally:
        assert proc.stop() == 0, proc.log()


def test_shape_mix_sends_every_length(bucketed_bert):
    done = run_loadtest(bucketed_bert.url, "--model", "bert-tiny", "-c", "4", "--duration", "1", "--warmup", "0",
                        "--shape-mix", "sequence=10,20,40,80", "--json", "--workers", "1")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    level = data["levels"][0]
    assert data["config"]["shape_mix"] == "sequence=10,20,40,80"
    # A quarter of the requests are 80 long, past the largest bucket: 400 naming the buckets; the rest succeed.
    assert set(level["errors"]) == {"400"} and "sequence=16,32,64" in level["error_samples"]["400"]
    assert level["requests"] >= 2 * level["errors"]["400"] > 0
    stats = httpx.get(f"{bucketed_bert.url}/v2/models/bert-tiny/stats", timeout=10).json()["model_stats"][0]
    assert stats["inference_count"] == level["requests"]


def test_shape_mix_sets_every_dynamic_axis_but_the_batch():
    metadata = {"inputs": [{"name": "ids", "shape": [-1, -1], "datatype": "INT64"},
                           {"name": "image", "shape": [-1, 3, -1, -1], "datatype": "FP32"}]}
    sets = make_input_mix(metadata, 2, {}, parse_shape_mix("len=5,7")[1], 0)
    assert [{k: v.shape for k, v in s.items()} for s in sets] == [
        {"ids": (2, 5), "image": (2, 3, 5, 5)}, {"ids": (2, 7), "image": (2, 3, 7, 7)}]
    for bad in ("sequence", "sequence=", "sequence=a,b", "=5", "sequence=0"):
        with pytest.raises(UsageError, match="--shape-mix"):
            parse_shape_mix(bad)
