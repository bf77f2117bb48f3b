"""Output of `batch`: one parquet file per input shard, written atomically, and a manifest of finished shards.

A shard's file is written to a temporary name in the output folder, flushed to disk, then renamed over its
final name (``os.replace`` is atomic on POSIX), and only then recorded in ``_manifest.json`` (itself replaced
atomically). A run killed at any point leaves finished shards complete and listed, and no partial file under a
final name; the next run skips what the manifest lists (same input fingerprint, file present) and redoes the rest.

Fingerprints are per shard (the paths, sizes and mtimes of the files that shard was made from), and the job header
holds only what decides how a row is computed (model, target, batch, shapes, input kind and columns), not which
files the folder holds: after a bad file is fixed or removed, or files are added, a rerun recomputes exactly the
shards whose inputs changed and keeps the rest. Records of shards that no longer exist, or whose inputs changed,
are dropped with their files before the run (``prune``), so the folder never holds a row twice.

A shard's record lists its bad inputs (``errors``: file, reason, stage, rows lost) and ``written``, the rows in its
file (fewer than ``rows`` when some were bad; no file at all when none was good).

Columns: ``row_id`` (string), ``row`` (int64, the row's index in its input shard), then one column per model
output: an Arrow ``fixed_shape_tensor`` holding the output's per-row shape (read it back with
``column.combine_chunks().to_numpy_ndarray()``, or :func:`load_results`), or a plain numeric column for outputs
of one number per row.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxaccel.errors import MissingDependencyError, OnnxAccelError, UsageError

MANIFEST = "_manifest.json"
MANIFEST_SCHEMA = "onnxaccel.batch-manifest/1"


class OutputError(OnnxAccelError):
    """The output folder cannot be written, or holds the results of another job."""

    exit_code = 2


@dataclass(frozen=True)
class ShardRecord:
    """A finished output shard: file (None when no row was good), input rows, the input fingerprint that makes
    resuming safe, rows written and the bad inputs met."""
    name: str
    index: int
    file: str | None
    rows: int
    fingerprint: str
    finished_at: float
    written: int | None = None
    errors: tuple[dict, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready form of the record, as kept in the output folder's manifest."""
        return {"index": self.index, "file": self.file, "rows": self.rows, "fingerprint": self.fingerprint,
                "finished_at": self.finished_at, "written": self.rows if self.written is None else self.written,
                "errors": list(self.errors)}

    @classmethod
    def from_dict(cls, name: str, r: dict) -> ShardRecord:
        """The record from its manifest form (manifests written before ``written``/``errors`` included)."""
        return cls(name, r["index"], r.get("file"), r["rows"], r["fingerprint"], r["finished_at"],
                   r.get("written"), tuple(r.get("errors") or ()))


def error_rows(bad) -> tuple[dict, ...]:
    """BadInputs as manifest error rows: one per (file, reason, stage), with the rows it cost."""
    out: dict[tuple, dict] = {}
    for item in bad:
        key = (item.file, item.reason, item.stage)
        row = out.setdefault(key, {"file": item.file, "reason": item.reason, "stage": item.stage, "rows": 0})
        row["rows"] += 0 if item.row is None else 1
    return tuple(out.values())


class OutputStore:
    """The output folder of one job. ``job`` describes the job (model, target, batch, input); a folder that holds
    another job's results is refused unless ``overwrite``."""

    def __init__(self, folder: str | Path, job: dict, *, overwrite: bool = False):
        self.folder = Path(folder).expanduser()
        self.job = job
        _make_writable(self.folder)
        self.path = self.folder / MANIFEST
        for stale in self.folder.glob(".*.tmp-*"):  # left by a run killed while writing; never under a final name
            stale.unlink(missing_ok=True)
        self.records: dict[str, ShardRecord] = {}
        existing = _read_manifest(self.path)
        if existing is not None:
            if overwrite:
                self._clear(existing)
            elif _comparable(existing.get("job")) != _comparable(job):
                raise OutputError(
                    f"{self.folder} holds the results of a different batch job "
                    f"({_difference(existing.get('job'), job)}).",
                    "Use another --output folder, or --overwrite to discard those results.")
            else:
                self.records = {name: ShardRecord.from_dict(name, r) for name, r in existing.get("shards", {}).items()}
        self._save()

    def is_done(self, name: str, fingerprint: str, rows: int) -> bool:
        """True when the shard was written from the same input (fingerprint and rows) and its file exists."""
        record = self.records.get(name)
        return (record is not None and record.fingerprint == fingerprint and record.rows == rows
                and (record.file is None or (self.folder / record.file).is_file()))

    def prune(self, keep: set[str]) -> list[str]:
        """Drop the records (and delete the files) of every shard not in ``keep``: shards gone from the input, or
        about to be recomputed because their inputs changed. Returns the names dropped."""
        dropped = sorted(set(self.records) - keep)
        for name in dropped:
            record = self.records.pop(name)
            if record.file:
                (self.folder / record.file).unlink(missing_ok=True)
        if dropped:
            self._save()
        return dropped

    def errors(self) -> list[dict]:
        """Every bad input the finished shards met, with its shard, in shard order."""
        return [{"shard": r.name, **e} for r in sorted(self.records.values(), key=lambda r: r.index)
                for e in r.errors]

    def write_bad(self, name: str, index: int, fingerprint: str, bad) -> ShardRecord:
        """Record a shard whose input could not be scanned: no file, its error."""
        return self._record(ShardRecord(name, index, None, 0, fingerprint, time.time(), 0, error_rows([bad])))

    def write(self, name: str, index: int, fingerprint: str, row_ids: list[str],
              outputs: dict[str, np.ndarray], *, rows: np.ndarray | None = None, rows_in: int | None = None,
              errors=()) -> ShardRecord:
        """Write one shard's outputs as parquet (atomically) and record it in the manifest. ``rows``: the index
        in the input shard of each row written (default: all of them, in order); ``rows_in``: the input shard's
        rows; ``errors``: its BadInputs. A shard with no good row gets a record and no file."""
        n = len(row_ids)
        rows_in = n if rows_in is None else rows_in
        if n == 0:
            (self.folder / f"{name}.parquet").unlink(missing_ok=True)
            return self._record(ShardRecord(name, index, None, rows_in, fingerprint, time.time(), 0,
                                            error_rows(errors)))
        pa, pq = _arrow()
        index_col = np.arange(n, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
        columns = {"row_id": _string_column(pa, row_ids), "row": _tensor_column(pa, index_col)}
        for key, value in outputs.items():
            columns[key] = _tensor_column(pa, value)
        table = pa.table(columns)
        file = f"{name}.parquet"
        final = self.folder / file
        tmp = self.folder / f".{file}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as handle:
                # No dictionary pages: model outputs are floats that rarely repeat and row ids are unique, so the
                # dictionary attempt only costs time (measured: 173 -> 138 ms for 8,192 rows of 1,000 floats).
                # Statistics only for the row columns and one-number outputs: min/max over every value of a tensor
                # column says little and cost ~10% of the write (2,048 rows of 1,000 floats: 18.2 -> 16.6 ms).
                pq.write_table(table, handle, use_dictionary=False, write_statistics=[
                    k for k, v in columns.items() if not isinstance(v.type, pa.BaseExtensionType)])
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, final)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise OutputError(f"Cannot write {final}: {exc}", "Check free space and permissions of --output.") from None
        return self._record(ShardRecord(name, index, file, rows_in, fingerprint, time.time(), n, error_rows(errors)))

    def _record(self, record: ShardRecord) -> ShardRecord:
        self.records[record.name] = record
        self._save()
        return record

    def _save(self) -> None:
        doc = {"schema": MANIFEST_SCHEMA, "job": self.job,
               "shards": {name: r.to_dict() for name, r in sorted(self.records.items())}}
        _write_atomic(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n")

    def _clear(self, existing: dict) -> None:
        for record in existing.get("shards", {}).values():
            if record.get("file"):
                (self.folder / record["file"]).unlink(missing_ok=True)
        self.records = {}


@dataclass
class BatchOutputs:
    """Every finished row of an output folder, in shard order (manifest order) and row order."""

    row_ids: list[str]
    outputs: dict[str, np.ndarray]
    shards: list[str]


def load_results(folder: str | Path) -> BatchOutputs:
    """Read back the finished shards of a `batch` output folder."""
    _, pq = _arrow()
    folder = Path(folder).expanduser()
    manifest = _read_manifest(folder / MANIFEST)
    if manifest is None:
        raise UsageError(f"{folder} has no {MANIFEST}: it is not a `batch` output folder.",
                         "Pass the folder given to `onnxaccel batch --output`.")
    ids: list[str] = []
    parts: dict[str, list[np.ndarray]] = {}
    shards = manifest.get("shards", {})
    names = sorted(shards, key=lambda n: shards[n].get("index", 0))
    names = [n for n in names if shards[n].get("file")]  # a shard with no good row has no file
    for name in names:
        table = pq.read_table(folder / manifest["shards"][name]["file"])
        ids.extend(table.column("row_id").to_pylist())
        for key in table.column_names:
            if key in ("row_id", "row"):
                continue
            parts.setdefault(key, []).append(_column_numpy(table.column(key)))
    return BatchOutputs(ids, {k: np.concatenate(v) for k, v in parts.items()}, names)


# Columns are built from the arrays' buffers (zero copy), not with pa.array or from_numpy_ndarray: those check
# for pandas objects and so import pandas at first use, a large import on a job's start-up path for nothing
# (pandas is never used here; docs/BENCHMARKS.md "Start-up"). tests/scale/test_writer_imports.py.

def _tensor_column(pa, value: np.ndarray):
    """A numeric output as an arrow column: one value per row, or a fixed-shape tensor per row."""
    value = np.ascontiguousarray(value)
    if value.dtype == np.bool_ or value.dtype.kind not in "iuf":  # bit-packed or not numeric: arrow converts
        return pa.array(value) if value.ndim == 1 else pa.FixedShapeTensorArray.from_numpy_ndarray(value)
    kind = pa.from_numpy_dtype(value.dtype)
    flat = pa.Array.from_buffers(kind, value.size, [None, pa.py_buffer(value)])
    if value.ndim == 1:
        return flat
    storage = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(value.shape[1:])))
    return pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(kind, list(value.shape[1:])), storage)


def _string_column(pa, values: list[str]):
    """Row ids as an arrow string column, from its offsets and bytes."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    large = offsets[-1] > np.iinfo(np.int32).max
    kind = pa.large_string() if large else pa.string()
    offsets = offsets if large else offsets.astype(np.int32)
    return pa.Array.from_buffers(kind, len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def _column_numpy(column) -> np.ndarray:
    column = column.combine_chunks()
    if hasattr(column, "to_numpy_ndarray"):
        return column.to_numpy_ndarray()
    return column.to_numpy(zero_copy_only=False)


def _arrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingDependencyError("pyarrow", "parquet", "Writing parquet output") from exc
    return pa, pq


def _make_writable(folder: Path) -> None:
    hint = "Pass a folder you can write to (it is created when missing)."
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OutputError(f"--output {folder} is a file (or lies under one), not a folder.", hint) from None
    except OSError as exc:
        raise OutputError(f"Cannot create --output {folder}: {exc.strerror}.", hint) from None
    probe = folder / f".write-probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"Cannot write to --output {folder}: {exc.strerror}.", hint) from None


def _read_manifest(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise OutputError(f"{path} is not a readable batch manifest: {exc}.",
                          "Delete it to recompute every shard, or use another --output folder.") from None
    if not isinstance(doc, dict) or doc.get("schema") != MANIFEST_SCHEMA:
        raise OutputError(f"{path} is not an onnxaccel batch manifest ({MANIFEST_SCHEMA}).",
                          "Use another --output folder.")
    return doc


def _comparable(job: dict | None) -> dict | None:
    """A job header without what the folder's contents decide: manifests written before per-shard resume held
    an ``input_fingerprint`` of the whole folder and its shard and row counts, which changed with any file."""
    if not isinstance(job, dict):
        return job
    job = {k: v for k, v in job.items() if k != "input_fingerprint"}
    if isinstance(job.get("input"), dict):
        job["input"] = {k: v for k, v in job["input"].items() if k not in ("shards", "rows", "path")}
    return job


def _difference(old: dict | None, new: dict) -> str:
    if not isinstance(old, dict):
        return "its manifest names no job"
    old, new = _comparable(old), _comparable(new)
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return "; ".join(f"{k}: {old.get(k)!r} there, {new.get(k)!r} now" for k in keys[:3])


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"Cannot write {path}: {exc.strerror}.",
                          "Check free space and permissions of --output.") from None
