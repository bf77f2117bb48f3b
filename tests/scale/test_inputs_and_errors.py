"""Datasets (images, npy/npz, parquet) become shards of rows with stable ids; bad inputs and outputs fail with a
message and a hint, before any model runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from onnxaccel import load_model
from onnxaccel.errors import InputError
from onnxaccel.scale.datasets import open_dataset, plan_units
from onnxaccel.scale.rows import RowReader
from tests.scale.conftest import write_images, write_npy_shards

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")




def test_image_folder_becomes_shards_with_relative_path_ids(tmp_path, squeezenet):
    folder = write_images(tmp_path / "imgs", 7)
    model = load_model(squeezenet).bind(batch=4)
    data = open_dataset(folder, model, images_per_shard=3)
    assert [s.rows for s in data.shards] == [3, 3, 1]
    assert data.shards[0].files[0] == "cats/img-001.png"  # sorted, relative to the folder
    units = plan_units(data, [0, 1, 2], 2)
    assert [(u.shard, u.start, u.stop) for u in units] == [(0, 0, 2), (0, 2, 3), (1, 0, 2), (1, 2, 3), (2, 0, 1)]
    ids, feeds = RowReader(data, model).read(units[0])
    assert ids == ["cats/img-001.png", "cats/img-003.png"]
    assert feeds["data_0"].shape == (2, 3, 224, 224) and feeds["data_0"].dtype == np.float32


def test_parquet_tensor_list_and_id_columns_feed_the_model(tmp_path, mlp_path):
    rows = np.arange(20, dtype=np.float32).reshape(5, 4)
    table = pa.table({"key": [f"k{i}" for i in range(5)],
                      "as_tensor": pa.FixedShapeTensorArray.from_numpy_ndarray(rows),
                      "as_list": pa.array([list(r) for r in rows], pa.list_(pa.float32()))})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=2)
    model = load_model(mlp_path).bind(batch=2)
    for column in ("as_tensor", "as_list"):
        data = open_dataset(tmp_path / "t.parquet", model, columns={"x": column}, id_column="key")
        ids, feeds = RowReader(data, model).read(plan_units(data, [0], 2)[1])  # rows 2-3 span row groups 1 and 2
        assert ids == ["k2", "k3"]
        np.testing.assert_array_equal(feeds["x"], rows[2:4])


def test_npz_arrays_map_to_inputs_by_name_or_column_option(tmp_path, mlp_path):
    np.savez(tmp_path / "a.npz", features=np.ones((6, 4), np.float32), other=np.zeros((6, 2), np.float32))
    model = load_model(mlp_path).bind(batch=4)
    with pytest.raises(InputError) as err:
        open_dataset(tmp_path, model)
    assert "--column x=ARRAY" in err.value.hint
    data = open_dataset(tmp_path, model, columns={"x": "features"})
    ids, feeds = RowReader(data, model).read(plan_units(data, [0], 4)[1])
    assert ids == ["a.npz:4", "a.npz:5"] and feeds["x"].shape == (2, 4)


def _error(result) -> str:
    assert result.exit_code in (1, 2), result.output
    text = result.stderr if hasattr(result, "stderr") else result.output
    return "".join(text.split())  # Rich wraps (and breaks) long lines at the console width: compare without spaces


def _has(text: str, *phrases: str) -> bool:
    return all("".join(p.split()) in text for p in phrases)


def test_empty_input_folder_is_refused_with_a_hint(cli, tmp_path, mlp_path):
    (tmp_path / "empty").mkdir()
    text = _error(cli(str(mlp_path), "--input", str(tmp_path / "empty"), "--output", str(tmp_path / "out"),
                      "--target", "cpu"))
    assert _has(text, "holds no images, .npy/.npz or .parquet files (it is empty)", "hint:"), text


def test_unreadable_files_are_refused_with_a_hint(cli, tmp_path, mlp_path):
    (tmp_path / "npy").mkdir()
    (tmp_path / "npy" / "bad.npy").write_bytes(b"this is not numpy")
    text = _error(cli(str(mlp_path), "--input", str(tmp_path / "npy"), "--output", str(tmp_path / "o1"),
                      "--target", "cpu"))
    assert _has(text, "not a valid .npy array", "numpy.save"), text
    (tmp_path / "pq").mkdir()
    (tmp_path / "pq" / "bad.parquet").write_bytes(b"PAR1 garbage")
    text = _error(cli(str(mlp_path), "--input", str(tmp_path / "pq"), "--output", str(tmp_path / "o2"),
                      "--target", "cpu"))
    assert _has(text, "not a valid parquet file", "hint:"), text


def test_missing_parquet_column_names_the_columns_and_the_option(cli, tmp_path, mlp_path):
    pq.write_table(pa.table({"pixels": pa.array([[0.0] * 4] * 3, pa.list_(pa.float32()))}), tmp_path / "d.parquet")
    text = _error(cli(str(mlp_path), "--input", str(tmp_path / "d.parquet"), "--output", str(tmp_path / "out"),
                      "--target", "cpu"))
    assert _has(text, "has no column 'x'", "columns: pixels", "--column x=COLUMN"), text
    ok = cli(str(mlp_path), "--input", str(tmp_path / "d.parquet"), "--output", str(tmp_path / "out"),
             "--target", "cpu", "--column", "x=pixels", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["rows"]["done"] == 3


def test_output_that_is_not_a_writable_folder_is_refused(cli, tmp_path, mlp_path):
    data = write_npy_shards(tmp_path / "npy", 1, 4, (4,))
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    for output in (blocker, blocker / "sub"):
        text = _error(cli(str(mlp_path), "--input", str(data), "--output", str(output), "--target", "cpu"))
        assert _has(text, "is a file (or lies under one), not a folder", "hint:"), text


def test_rows_of_the_wrong_shape_are_refused_before_running(cli, tmp_path, mlp_path):
    data = write_npy_shards(tmp_path / "npy", 1, 4, (5,))
    text = _error(cli(str(mlp_path), "--input", str(data), "--output", str(tmp_path / "o"), "--target", "cpu"))
    assert _has(text, "rows for input 'x' have shape [5]; the model takes [4] per row"), text


def test_output_of_another_job_is_not_mixed_in(cli, tmp_path, mlp_path, npy_data):
    out = str(tmp_path / "out")
    first = cli(str(mlp_path), "--input", str(npy_data), "--output", out, "--target", "cpu", "--batch", "8")
    assert first.exit_code == 0, first.output
    text = _error(cli(str(mlp_path), "--input", str(npy_data), "--output", out, "--target", "cpu", "--batch", "4"))
    assert _has(text, "holds the results of a different batch job (batch: 8 there, 4 now)", "--overwrite"), text
    again = cli(str(mlp_path), "--input", str(npy_data), "--output", out, "--target", "cpu", "--batch", "4",
                "--overwrite", "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["shards"]["done"] == 3


def test_a_corrupt_image_stops_the_run_naming_the_file_with_on_error_stop(cli, tmp_path, squeezenet):
    folder = write_images(tmp_path / "imgs", 3)
    (folder / "dogs" / "zz-broken.png").write_bytes(b"\x89PNG broken")
    text = _error(cli(squeezenet, "--input", str(folder), "--output", str(tmp_path / "o"), "--target", "cpu",
                      "--on-error", "stop"))
    assert _has(text, "The job stopped at", "(--on-error stop)", "Cannot read image", "zz-broken.png",
                "rerun the same command"), text


def test_tuned_config_gives_target_and_batch(cli, tmp_path, mlp_path, npy_data):
    config = tmp_path / "tuned.json"
    config.write_text(json.dumps({"schema": "onnxaccel.config/1", "model": str(mlp_path), "target": "cpu",
                                  "batch": 4}))
    result = cli(str(mlp_path), "--input", str(npy_data), "--output", str(tmp_path / "out"), "--config",
                 str(config), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["target"], report["batch"], report["rows"]["done"]) == ("cpu", 4, 57)


def test_unreachable_cluster_address_fails_fast_with_a_hint(tmp_path, mlp_path, npy_data):
    """Ray itself retries an unreachable GCS for minutes; `--ray HOST:PORT` checks the address first."""
    import subprocess
    import sys
    import time

    from tests.scale.conftest import BATCH_APP

    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", BATCH_APP, "batch", str(mlp_path), "--input", str(npy_data),
                           "--output", str(tmp_path / "out"), "--target", "cpu", "--ray", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and time.monotonic() - start < 30
    text = "".join(done.stderr.split())
    assert _has(text, "Cannot reach the Ray cluster at 127.0.0.1:1", "hint:", "--ray local"), done.stderr
