"""ShardAssembler (scale/assemble.py): rows arrive in any order (Ray) or as runs of consecutive rows (the
pipeline's units), each exactly once; a repeat or a missing row is an error, never a file; bad rows are dropped
with their shard written from the good ones."""

from __future__ import annotations

import numpy as np
import pytest

from onnxaccel import load_model
from onnxaccel.scale.assemble import RowAccountingError, ShardAssembler
from onnxaccel.scale.datasets import BadInput, open_dataset
from onnxaccel.scale.writer import OutputStore, load_results
from tests.scale.conftest import write_npy_shards


@pytest.fixture
def parts(tmp_path, mlp_path):
    data = write_npy_shards(tmp_path / "npy", shards=3, rows=10, row_shape=(4,))  # shards 0 and 1: 10 rows
    dataset = open_dataset(str(data), load_model(str(mlp_path)).bind(None, batch=4))
    store = OutputStore(tmp_path / "out", {"job": "test"})
    return dataset, store, tmp_path / "out"


def _rows(shard, rows):
    rows = np.asarray(rows)
    return [f"s{shard}:{r}" for r in rows], {"y": np.stack([np.full(3, 10 * shard + r, np.float32) for r in rows])}


def test_runs_and_scattered_rows_land_in_their_places(parts):
    dataset, store, out = parts
    assembler = ShardAssembler(dataset, store)
    for shard, chunks in ((0, ([4, 5, 6, 7], [0, 1, 2, 3], [8, 9])), (1, ([9, 2, 5], [0, 1, 3, 4, 6, 7, 8]))):
        for rows in chunks:
            ids, outputs = _rows(shard, rows)
            assembler.add(shard, np.array(rows), ids, outputs)
    assembler.check_complete()
    got = load_results(out)
    assert got.row_ids == [f"s{s}:{r}" for s in (0, 1) for r in range(10)]
    np.testing.assert_array_equal(got.outputs["y"][:, 0], [10 * s + r for s in (0, 1) for r in range(10)])


@pytest.mark.parametrize("second", [[2, 3], [3, 1], [5, 5]])
def test_a_row_twice_is_an_error(parts, second):
    dataset, store, _ = parts
    assembler = ShardAssembler(dataset, store)
    assembler.add(0, np.array([0, 1, 2, 3]), *_rows(0, [0, 1, 2, 3]))
    with pytest.raises(RowAccountingError, match="came back twice"):
        assembler.add(0, np.array(second), *_rows(0, second))
    assert not assembler.written


def test_a_missing_row_is_an_error_and_bad_rows_are_dropped(parts):
    dataset, store, out = parts
    assembler = ShardAssembler(dataset, store)
    assembler.add(0, np.arange(10), *_rows(0, range(10)), bad=[BadInput("x.npy", "unreadable", "read", 4)])
    assembler.add(1, np.arange(9), *_rows(1, range(9)))
    with pytest.raises(RowAccountingError, match="1 row\\(s\\) missing \\(first: \\[9\\]\\)"):
        assembler.check_complete()
    got = load_results(out)
    assert got.row_ids == [f"s0:{r}" for r in range(10) if r != 4]
    assert assembler.written[0].written == 9 and assembler.written[0].errors[0]["reason"] == "unreadable"


@pytest.mark.parametrize("got", [1, 3, 5])
def test_an_output_with_other_than_one_row_per_input_row_is_an_error_not_a_broadcast(parts, got):
    # A run of 4 consecutive rows whose output has 1 row (numpy would broadcast it into all 4), 3 or 5: refused.
    dataset, store, _ = parts
    assembler = ShardAssembler(dataset, store)
    ids, _ = _rows(0, range(4))
    with pytest.raises(RowAccountingError, match=f"output 'y' has {got} row\\(s\\) for 4 input row\\(s\\)"):
        assembler.add(0, np.arange(4), ids, {"y": np.zeros((got, 3), np.float32)})


def test_the_store_opens_without_pyarrow_and_says_so_where_it_writes(tmp_path, monkeypatch):
    # pyarrow is optional: opening the output folder (and its warm-up of the tensor columns) must not fail
    # without it; the missing-dependency error comes from the first parquet write, with how to install it.
    from onnxaccel.errors import MissingDependencyError
    from onnxaccel.scale import writer

    def no_arrow():
        raise MissingDependencyError("pyarrow", "ray", "Writing parquet output")

    monkeypatch.setattr(writer, "_arrow", no_arrow)
    store = OutputStore(tmp_path / "out", {"job": "test"})
    assert (tmp_path / "out").is_dir() and store.records == {}
