"""A batch job's parquet writer never imports pandas (pyarrow's pa.array and from_numpy_ndarray check for pandas
objects and import it at first use: a large import on the start-up path, for nothing). The shards written
read back equal to what was given, strings and tensors alike."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("pyarrow")


def test_a_batch_job_imports_no_pandas(tmp_path, mlp_path):
    data = tmp_path / "npy"
    data.mkdir()
    np.save(data / "part-000.npy", np.random.default_rng(0).random((10, 4), dtype=np.float32))
    code = textwrap.dedent(f"""
        import json, sys
        from onnxaccel.scale import BatchJob, run_batch
        report = run_batch(BatchJob({str(mlp_path)!r}, {str(data)!r}, {str(tmp_path / "out")!r}, target="cpu",
                                    batch=4))
        print(json.dumps({{"rows": report.rows_done, "pandas": "pandas" in sys.modules}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"rows": 10, "pandas": False}


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.int8])
def test_columns_read_back_as_written(tmp_path, dtype):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from onnxaccel.scale.writer import _column_numpy, _string_column, _tensor_column

    rng = np.random.default_rng(1)
    tensor = (rng.random((5, 2, 3)) * 100).astype(dtype)
    flat = (rng.random(5) * 100).astype(dtype)
    ids = ["a", "", "ü-β", "row 4", "x" * 300]
    pq.write_table(pa.table({"id": _string_column(pa, ids), "t": _tensor_column(pa, tensor),
                             "f": _tensor_column(pa, flat)}), tmp_path / "s.parquet")
    back = pq.read_table(tmp_path / "s.parquet")
    assert back.column("id").to_pylist() == ids
    np.testing.assert_array_equal(_column_numpy(back.column("t")), tensor)
    np.testing.assert_array_equal(_column_numpy(back.column("f")), flat)
    assert _column_numpy(back.column("t")).dtype == np.dtype(dtype)
