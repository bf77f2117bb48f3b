"""`batch` reads .npy rows with one seek and one readinto (scale/rows.py read_npy_rows): the rows equal
np.load's for C- and Fortran-ordered arrays, every dtype numpy.save writes, and slices past the end; a file cut
short is an error, not a row of garbage."""

from __future__ import annotations

import numpy as np
import pytest

from onnxaccel.scale.rows import read_npy_rows

ARRAYS = {
    "uint8-images": np.random.default_rng(0).integers(0, 256, (6, 8, 8, 3), dtype=np.uint8),
    "float32": np.arange(5 * 3 * 4, dtype=np.float32).reshape(5, 3, 4),
    "int64-1d": np.arange(7, dtype=np.int64),
    "float16": np.linspace(-2, 2, 10, dtype=np.float16).reshape(5, 2),
    "fortran": np.asfortranarray(np.arange(12.0).reshape(4, 3)),
    "empty": np.zeros((0, 3), np.uint8),
    "big-endian": np.arange(6, dtype=">i4").reshape(3, 2),
}


@pytest.mark.parametrize("name", list(ARRAYS))
@pytest.mark.parametrize("start, stop", [(0, None), (1, 3), (2, 100), ("end", "end")])
def test_rows_equal_np_load(tmp_path, name, start, stop):
    arr = ARRAYS[name]
    path = tmp_path / "a.npy"
    np.save(path, arr)
    start = len(arr) if start == "end" else start
    stop = len(arr) if stop in (None, "end") else stop
    got = read_npy_rows(path, start, stop)
    want = np.load(path)[start:stop]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_a_file_cut_short_is_an_error(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, ARRAYS["uint8-images"])
    path.write_bytes(path.read_bytes()[:-100])
    for start, stop in ((0, 2), (4, 6)):  # one message for the file, whichever rows are read
        with pytest.raises(ValueError, match=r"the file holds \d+ bytes of data; its header \(\[6, 8, 8, 3\] uint8\) "
                           "needs 1152$"):
            read_npy_rows(path, start, stop)


@pytest.mark.parametrize("name", ["uint8-images", "float32", "float16", "big-endian"])
def test_rows_are_read_into_a_buffer_of_their_dtype_and_row_shape(tmp_path, name):
    """A reused (page-locked, in a GPU job) buffer receives the rows in place: the result is its first rows."""
    arr = ARRAYS[name]
    path = tmp_path / "a.npy"
    np.save(path, arr)
    buffer = np.full((4, *arr.shape[1:]), 7, arr.dtype)
    got = read_npy_rows(path, 1, 3, out=buffer)
    assert got.ctypes.data == buffer.ctypes.data and got.shape == (2, *arr.shape[1:])
    np.testing.assert_array_equal(got, arr[1:3])
    np.testing.assert_array_equal(buffer[2:], np.full((2, *arr.shape[1:]), 7, arr.dtype))  # rows past: untouched


def test_a_buffer_that_does_not_fit_is_not_used(tmp_path):
    arr = ARRAYS["uint8-images"]
    path = tmp_path / "a.npy"
    np.save(path, arr)
    for buffer in (np.zeros((2, 8, 8, 3), np.float32), np.zeros((1, 8, 8, 3), np.uint8),
                   np.zeros((4, 8, 3, 8), np.uint8)):
        got = read_npy_rows(path, 0, 2, out=buffer)
        assert got.ctypes.data != buffer.ctypes.data and not buffer.any()
        np.testing.assert_array_equal(got, arr[:2])


@pytest.mark.parametrize("layout", ["c", "fortran", "npz"])
def test_headers_are_parsed_one_thread_at_a_time(tmp_path, monkeypatch, layout):
    # numpy parses .npy headers with ast.literal_eval, which CPython 3.11 cannot run in two threads at once
    # ("SystemError: AST constructor recursion depth mismatch", python/cpython#106905): a `batch --ray` actor
    # reads two units at once. Count the parses that overlap, widening the window with a sleep; without
    # NPY_HEADER_LOCK several of the 8 threads are inside at once.
    import ast
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from onnxaccel.scale import rows

    arr = np.arange(4 * 3, dtype=np.float32).reshape(4, 3)
    path = tmp_path / ("a.npz" if layout == "npz" else "a.npy")
    if layout == "npz":
        np.savez(path, x=arr)
    else:
        np.save(path, np.asfortranarray(arr) if layout == "fortran" else arr)
    inside, most, guard = [0], [0], threading.Lock()
    real = ast.literal_eval

    def slow_literal_eval(text):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        try:
            return real(text)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(ast, "literal_eval", slow_literal_eval)
    read = (lambda _: rows._load_npz(path)["x"]) if layout == "npz" else (lambda _: read_npy_rows(path, 0, 4))
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(read, range(16)))
    assert all(np.array_equal(g, arr) for g in got)
    assert most[0] == 1, f"{most[0]} threads parsed a .npy header at once"
