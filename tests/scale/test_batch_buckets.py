"""`batch --shape-buckets`: .npz shards of different sequence lengths padded to buckets on a real CPU session of
zoo:bert-tiny; the written outputs are cropped back and equal unpadded runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from onnxaccel.bench.config import TunedConfig, save_config
from onnxaccel.cli.main import app
from onnxaccel.engines import compile_model
from onnxaccel.model import load_model
from onnxaccel.target import parse_target

LENGTHS = (20, 40)


@pytest.fixture(scope="module")
def token_shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(7)
    for length in LENGTHS:
        ids = rng.integers(1, 1000, (3, length)).astype(np.int64)
        np.savez(folder / f"len{length}.npz", input_ids=ids, attention_mask=np.ones_like(ids),
                 token_type_ids=np.zeros_like(ids))
    return folder


def _read(path) -> np.ndarray:
    import pyarrow.parquet as pq

    return pq.read_table(path).column("last_hidden_state").combine_chunks().to_numpy_ndarray()


def _expected(folder, length: int) -> np.ndarray:
    with np.load(folder / f"len{length}.npz") as data:
        feeds = {k: data[k] for k in data.files}
    model = load_model("zoo:bert-tiny").bind({"sequence": (length,)}, batch=3)
    with compile_model(model, parse_target("cpu")) as plain:
        return plain.run(feeds)["last_hidden_state"]


def test_rows_of_different_lengths_are_padded_to_buckets_and_cropped_back(token_shards, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["batch", "zoo:bert-tiny", "-i", str(token_shards), "-o", str(out),
                                      "--shape-buckets", "sequence=32,64", "--batch", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["rows"]["done"] == 6 and report["shape_buckets"] == "sequence=32,64"
    for length in LENGTHS:
        written = _read(out / f"len{length}.parquet")
        assert written.shape == (3, length, 128)
        np.testing.assert_allclose(written, _expected(token_shards, length), atol=1e-4, rtol=1e-4)


def test_without_buckets_each_length_runs_in_a_group_of_its_own(token_shards, tmp_path):
    """The files' lengths bind `sequence` (over the zoo's metadata default of 128): no padding, exact results."""
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["batch", "zoo:bert-tiny", "-i", str(token_shards), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert sorted(e["shapes"]["input_ids"][1] for e in report["shapes"]) == list(LENGTHS)
    for length in LENGTHS:
        np.testing.assert_allclose(_read(out / f"len{length}.parquet"), _expected(token_shards, length),
                                   atol=1e-4, rtol=1e-4)


def test_rows_longer_than_every_bucket_name_the_buckets(token_shards, tmp_path):
    result = CliRunner().invoke(app, ["batch", "zoo:bert-tiny", "-i", str(token_shards), "-o", str(tmp_path / "o"),
                                      "--shape-buckets", "sequence=16,32"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "fits no shape bucket" in text and "sequence=16,32" in text


def test_config_shape_buckets_apply_to_batch(token_shards, tmp_path):
    config = save_config(TunedConfig(model="zoo:bert-tiny", target=parse_target("cpu"),
                                     shape_buckets="sequence=64"), tmp_path / "tuned.json")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["batch", "zoo:bert-tiny", "-i", str(token_shards), "-o", str(out),
                                      "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert _read(out / "len40.parquet").shape == (3, 40, 128)
