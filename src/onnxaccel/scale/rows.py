"""Reading the rows of a unit into model feeds: image decoding, .npy slices (memory-mapped), .npz arrays, parquet
row groups, each cast to the input's dtype when the cast is lossless.

With ``skip_bad_images``, an image that cannot be decoded (the file's own fault: PIL raised an OSError) is fed as a
row of zeros and reported as a :class:`BadInput`, so the other rows of its unit keep their batch composition and
the driver drops that row's outputs. Errors of the setup (an input that is not an image tensor) still raise.
"""

from __future__ import annotations

import io
import os
import threading
import zipfile
from pathlib import Path

import numpy as np

from onnxaccel.errors import InputError
from onnxaccel.inputs import load_image
from onnxaccel.model import Model, TensorSpec
from onnxaccel.prepost.cpu_decode import decode_pixels
from onnxaccel.scale.datasets import (NPY_HEADER_LOCK, BadInput, Dataset, Shard, Unit, parquet_modules,
                                      read_npy_header, row_shape_of)


class RowReader:
    """Reads the rows of units into feeds for a bound model. Keeps the last parquet/npz file open, since the
    units of one shard usually follow one another."""

    def __init__(self, dataset: Dataset, model: Model, *, skip_bad_images: bool = False):
        self.dataset = dataset
        self.model = model
        self.skip_bad_images = skip_bad_images
        self._cache_key: str | None = None
        self._cache = None
        self._lock = threading.Lock()  # an actor may read two units at once, in threads

    def read(self, unit: Unit) -> tuple[list[str], dict[str, np.ndarray]]:
        """Read the rows of a unit: their ids and one array per model input."""
        ids, feeds, _ = self.read_rows(unit)
        return ids, feeds

    def read_rows(self, unit: Unit, out: dict[str, np.ndarray] | None = None
                  ) -> tuple[list[str], dict[str, np.ndarray], list[BadInput]]:
        """Like ``read``, plus the images that could not be decoded (zeros in the feeds; ``skip_bad_images``).
        ``out``: per input, a reused buffer of at least the unit's rows (e.g. page-locked, for direct copies to a
        GPU): the feeds are then its first rows (.npy rows are read straight into it, the rest copied in)."""
        shard = self.dataset.shards[unit.shard]
        kind = self.dataset.kind
        if kind == "images":
            ids, feeds, bad = self._images(shard, unit)
        elif kind == "arrays":
            ids, feeds, bad = (*self._arrays(shard, unit, out), [])
        else:
            ids, feeds, bad = (*self._parquet(shard, unit), [])
        return ids, _into(feeds, out), bad

    def _path(self, rel: str) -> Path:
        return Path(self.dataset.root) / rel

    def _images(self, shard: Shard, unit: Unit):
        spec = self.model.inputs[0]
        shape = (1, *row_shape_of(self.model, spec.name))
        rows, bad = [], []
        ids = list(shard.files[unit.start:unit.stop])
        pixels = np.dtype(spec.dtype) == np.uint8 and len(shape) == 4 and shape[3] == 3
        for row, rel in enumerate(ids, start=unit.start):
            try:
                if pixels:  # preprocessing embedded in the model: uint8 NHWC at the preset's geometry
                    rows.append(decode_pixels(self._path(rel), shape[1], shape[2], self.dataset.preprocess)[None])
                else:
                    rows.append(load_image(self._path(rel), spec, shape, self.dataset.preprocess))
            except InputError as exc:
                if not (self.skip_bad_images and isinstance(exc.__cause__, OSError)):
                    raise
                rows.append(np.zeros(shape, np.dtype(spec.dtype)))
                bad.append(BadInput(rel, exc.message, "read", row))
        return ids, {spec.name: np.concatenate(rows, axis=0)}, bad

    def _arrays(self, shard: Shard, unit: Unit, out: dict[str, np.ndarray] | None = None):
        rel = shard.files[0]
        path = self._path(rel)
        ids = [f"{rel}:{i}" for i in range(unit.start, unit.stop)]
        feeds = {}
        if path.suffix.lower() == ".npy":
            spec = self.model.inputs[0]
            buffer = (out or {}).get(spec.name)
            try:
                rows = read_npy_rows(path, unit.start, unit.stop, out=buffer)
            except (ValueError, OSError) as exc:
                raise InputError(f"Cannot read {path}: {exc}", "Write shards with numpy.save.") from None
            feeds[spec.name] = _cast(rows, spec, path)
            return ids, feeds
        arrays = self._cached(rel, lambda: _load_npz(path))
        for spec in self.model.inputs:
            key = self.dataset.columns.get(spec.name, spec.name)
            if key not in arrays and len(arrays) == 1:
                key = next(iter(arrays))
            feeds[spec.name] = _cast(arrays[key][unit.start:unit.stop], spec, path)
        return ids, feeds

    def _parquet(self, shard: Shard, unit: Unit):
        pa, pq = parquet_modules()
        rel = shard.files[0]
        path = self._path(rel)
        handle = self._cached(rel, lambda: pq.ParquetFile(path))
        wanted = sorted({*self.dataset.columns.values(), *([self.dataset.id_column] if self.dataset.id_column else [])})
        table = _read_rows(handle, unit.start, unit.stop, wanted)
        if self.dataset.id_column:
            ids = [str(v) for v in table.column(self.dataset.id_column).to_pylist()]
        else:
            ids = [f"{rel}:{i}" for i in range(unit.start, unit.stop)]
        feeds = {}
        for spec in self.model.inputs:
            column = self.dataset.columns[spec.name]
            feeds[spec.name] = self._column(table.column(column), spec, f"{path} column '{column}'")
        return ids, feeds

    def _column(self, column, spec: TensorSpec, where: str) -> np.ndarray:
        pa, _ = parquet_modules()
        column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
        kind = column.type
        row_shape = row_shape_of(self.model, spec.name) or ()
        if isinstance(kind, pa.BaseExtensionType) and not hasattr(column, "to_numpy_ndarray"):
            column, kind = column.storage, column.storage.type  # e.g. Ray's tensor type: a list underneath
        if hasattr(column, "to_numpy_ndarray"):  # arrow.fixed_shape_tensor
            values = column.to_numpy_ndarray()
        elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            shape = (1, *row_shape)
            values = np.concatenate([load_image(io.BytesIO(b), spec, shape, self.dataset.preprocess)
                                     for b in column.to_pylist()], axis=0)
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            flat = column.flatten()
            while pa.types.is_list(flat.type) or pa.types.is_large_list(flat.type) or \
                    pa.types.is_fixed_size_list(flat.type):
                flat = flat.flatten()
            values = flat.to_numpy(zero_copy_only=False)
            per_row = int(np.prod(row_shape)) if row_shape else 1
            if values.size != per_row * len(column):
                raise InputError(f"{where}: {values.size // max(1, len(column))} values per row; input '{spec.name}' "
                                 f"takes {per_row} ({list(row_shape)}).",
                                 "Store each row as a flat list of the input's per-row size, or bind --shape.")
            values = values.reshape(len(column), *row_shape)
        elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            values = column.to_numpy(zero_copy_only=False)
            if row_shape not in ((), (1,)):
                raise InputError(f"{where} holds one number per row; input '{spec.name}' takes {list(row_shape)} "
                                 "per row.",
                                 "Store tensors as list<...> or fixed_shape_tensor columns.")
            values = values.reshape(len(column), *row_shape)
        else:
            raise InputError(f"{where} has type {kind}, which `batch` cannot feed to a model.",
                             "Use numeric list/fixed_size_list/fixed_shape_tensor columns, or binary image bytes.")
        return _cast(values, spec, where)

    def _cached(self, key: str, load):
        with self._lock:
            if self._cache_key != key:
                self._cache, self._cache_key = load(), key
            return self._cache


def _read_rows(handle, start: int, stop: int, columns: list[str]):
    """Rows [start, stop) reading only the row groups that hold them."""
    meta = handle.metadata
    groups, first, offset = [], None, 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if offset + n > start and offset < stop:
            groups.append(g)
            first = offset if first is None else first
        offset += n
    table = handle.read_row_groups(groups, columns=columns)
    return table.slice(start - (first or 0), stop - start)


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with NPY_HEADER_LOCK, np.load(path, allow_pickle=False) as data:  # a header per member
            return {k: data[k] for k in data.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"Cannot read {path}: {exc}", "Write shards with numpy.savez.") from None


def read_npy_rows(path: Path, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
    """Rows ``start:stop`` of a .npy file, read with one seek and one ``readinto`` into a fresh array (a copy
    out of ``np.load(mmap_mode="r")`` faults every 4 KiB page in, which capped `batch` on uint8 images with the
    read stage nearly always busy: the history of docs/BENCHMARKS.md). Fortran-ordered or object arrays go
    through np.load.
    ``out``: a reused C-contiguous buffer of at least the rows asked for, read into when the file's dtype and row
    shape are its own (its first rows are returned); otherwise ignored."""
    with open(path, "rb") as f:
        shape, fortran, dtype = read_npy_header(f)
        if fortran or dtype.hasobject or not shape:
            with NPY_HEADER_LOCK:
                data = np.load(path, mmap_mode="r", allow_pickle=False)
            return np.array(data[start:stop])
        offset = f.tell()
        need = int(np.prod(shape)) * dtype.itemsize
        have = os.fstat(f.fileno()).st_size - offset
        if have < need:  # the same message for every unit of the file: one error row per file in the report
            raise ValueError(f"the file holds {have} bytes of data; its header ({list(shape)} {dtype}) needs {need}")
        stop = min(stop, shape[0])
        rows = max(0, stop - start)
        if (out is not None and out.dtype == dtype and out.shape[1:] == tuple(shape[1:]) and out.shape[0] >= rows
                and out.flags.c_contiguous):
            out = out[:rows]
        else:
            out = np.empty((rows, *shape[1:]), dtype)
        f.seek(offset + start * (out[0].nbytes if len(out) else 0))
        if out.nbytes and f.readinto(memoryview(out.reshape(-1).view(np.uint8))) != out.nbytes:
            raise ValueError(f"the file changed while it was read (rows {start}:{stop})")
        return out


def _into(feeds: dict[str, np.ndarray], out: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The feeds as the first rows of the ``out`` buffers (copied in unless already read there); feeds that do
    not fit a buffer (another dtype or row shape, more rows) stay as they are."""
    if not out:
        return feeds
    placed = {}
    for name, value in feeds.items():
        buffer = out.get(name)
        n = value.shape[0] if value.ndim else 0
        if (buffer is None or not value.ndim or buffer.dtype != value.dtype or buffer.shape[1:] != value.shape[1:]
                or buffer.shape[0] < n):
            placed[name] = value
        elif value.ctypes.data == buffer.ctypes.data:  # read straight into it
            placed[name] = value
        else:
            np.copyto(buffer[:n], value)
            placed[name] = buffer[:n]
    return placed


def _cast(values: np.ndarray, spec: TensorSpec, where) -> np.ndarray:
    want = np.dtype(spec.dtype)
    if values.dtype != want:
        if not np.can_cast(values.dtype, want, casting="safe"):
            raise InputError(f"{where}: input '{spec.name}' expects {want.name}; the data is {values.dtype.name}.",
                             f"Store it as {want.name}.")
        values = values.astype(want)
    return np.ascontiguousarray(values)
