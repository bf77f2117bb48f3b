"""Input datasets for `batch`: a folder of images, .npy/.npz shards, or parquet columns, as shards of rows with
stable row ids.

A *shard* is the unit of output and of resume: one input file (.npy, .npz, .parquet) or, for images, a run of
``images_per_shard`` files in sorted order. A *unit* is the unit of work: up to ``batch`` consecutive rows of one
shard, run as one model call. Units always start at a multiple of ``batch`` inside their shard, so every row is
computed in the same batch composition whichever runner (in-process or Ray) and whichever worker runs it.

Row ids: images use their path relative to the input folder; array and parquet rows use ``FILE:ROW`` (or the
value of ``id_column`` in parquet). Everything here is picklable, because Ray actors read their own units.

Bad inputs (``on_error="skip"``): a file that cannot be scanned (not a valid .npy/.npz/parquet file, or rows that
do not fit the model) becomes a shard with no rows and a :class:`BadInput` (stage ``scan``); the job records it
and goes on. A whole dataset of bad files is still an error: there is nothing to run.
"""

from __future__ import annotations

import hashlib
import threading
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnxaccel.errors import InputError, MissingDependencyError
from onnxaccel.inputs import IMAGE_SUFFIXES, ImagePreprocess
from onnxaccel.model import Model, TensorSpec

ARRAY_SUFFIXES = {".npy", ".npz"}
PARQUET_SUFFIXES = {".parquet", ".pq"}
IMAGES_PER_SHARD = 1024


ON_ERROR = ("skip", "stop")


@dataclass(frozen=True)
class BadInput:
    """An input that could not be used: the file (relative to the dataset root), why, and the stage: ``scan``
    (while planning the job: headers, metadata, row shapes) or ``read`` (while reading or decoding rows)."""

    file: str
    reason: str
    stage: str
    #: The row (index in its shard) it stands for; None: the whole shard.
    row: int | None = None

    def to_dict(self) -> dict:
        """JSON-ready form, as kept in the manifest and the report."""
        return {"file": self.file, "reason": self.reason, "stage": self.stage, "row": self.row}


@dataclass(frozen=True)
class Shard:
    """One input file (or group of images) of a dataset; it becomes one output parquet file."""
    index: int
    #: Stable name: the output file is ``NAME.parquet``.
    name: str
    #: One file (arrays, parquet) or the image files of this shard, relative to the dataset root.
    files: tuple[str, ...]
    rows: int
    #: Relative paths, sizes and mtimes of exactly the files of this shard: a shard whose inputs changed (or
    #: moved between shards) is recomputed on resume, and no other.
    fingerprint: str
    #: Set when the shard's file could not be scanned (``on_error="skip"``): the shard has no rows.
    bad: BadInput | None = None
    #: Per model input, the shape of one row as the file holds it (.npy/.npz shards, parquet tensor columns;
    #: empty for images): what binds the model's symbolic dims for this shard (scale/shape_groups.py).
    row_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class Unit:
    """Rows [start, stop) of shard ``shard`` (its index), run as one model call."""

    shard: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        """Number of rows in the unit."""
        return self.stop - self.start


@dataclass(frozen=True)
class Dataset:
    """What `batch` reads: its kind, root, shards, and how model inputs map to the data."""

    kind: str  # "images", "arrays" or "parquet"
    root: str
    shards: tuple[Shard, ...]
    #: input name -> parquet column (parquet) or npz array name (arrays).
    columns: Mapping[str, str] = field(default_factory=dict)
    id_column: str | None = None
    preprocess: ImagePreprocess = field(default_factory=ImagePreprocess)

    @property
    def rows(self) -> int:
        """Number of rows over every shard."""
        return sum(s.rows for s in self.shards)

    def describe(self) -> dict:
        """JSON-ready summary of the dataset for the batch report."""
        return {"kind": self.kind, "path": self.root, "shards": len(self.shards), "rows": self.rows,
                "columns": dict(self.columns), "id_column": self.id_column}


def plan_units(dataset: Dataset, shard_indices: Sequence[int], batch: int) -> list[Unit]:
    """Units of ``batch`` rows (the last of a shard may be shorter) for the given shards, in order."""
    units = []
    for index in shard_indices:
        rows = dataset.shards[index].rows
        units.extend(Unit(index, start, min(start + batch, rows)) for start in range(0, rows, batch))
    return units


# --- discovery ----------------------------------------------------------------------------------------------

def open_dataset(path: str | Path, model: Model, *, columns: Mapping[str, str] | None = None,
                 id_column: str | None = None, preprocess: ImagePreprocess | None = None,
                 images_per_shard: int = IMAGES_PER_SHARD, on_error: str = "stop") -> Dataset:
    """Find the shards under ``path`` (a folder or one .parquet/.npy/.npz file) and check them against the
    model's inputs: columns present, row shapes right. Raises InputError with a hint on anything wrong; with
    ``on_error="skip"`` a file that fails these checks becomes a shard marked ``bad`` instead, unless every file
    does."""
    root = Path(path).expanduser()
    pre = preprocess or ImagePreprocess()
    if not root.exists():
        raise InputError(f"--input {path} does not exist.", "Pass a folder of images, .npy/.npz files or "
                         ".parquet files, or one such file.")
    files = [root] if root.is_file() else sorted(
        p for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    base = root.parent if root.is_file() else root
    kinds = {_kind(p) for p in files} - {None}
    if not kinds:
        raise InputError(
            f"--input {path} holds no images, .npy/.npz or .parquet files" + (" (it is empty)." if not files else "."),
            "Point --input at a folder of images (" + ", ".join(sorted(IMAGE_SUFFIXES)) + "), of .npy/.npz "
            "shards, or of .parquet files.")
    if len(kinds) > 1:
        raise InputError(f"--input {path} mixes {' and '.join(sorted(kinds))}; one batch job reads one kind.",
                         "Put each kind of data in its own folder.")
    kind = kinds.pop()
    files = [p for p in files if _kind(p) == kind]
    if kind == "images":
        shards = _image_shards(files, base, model, images_per_shard)
    elif kind == "arrays":
        shards = _scan(files, base, on_error, lambda p: _array_shard(p, base, model, dict(columns or {})))
    else:
        pa_pq = parquet_modules()
        shards = _scan(files, base, on_error,
                       lambda p: _parquet_shard(pa_pq, p, base, model, dict(columns or {}), id_column))
    if not any(s.rows for s in shards):
        raise InputError(f"--input {path} has files but no rows.", "Check that the arrays/tables are not empty.")
    mapping = dict(columns or {})
    if kind == "parquet":
        mapping = {s.name: mapping.get(s.name, s.name) for s in model.inputs}
    return Dataset(kind, str(base), tuple(shards), mapping, id_column, pre)


def input_kind(path: str) -> str | None:
    """What ``--input`` holds (images, arrays, parquet) judged by its first file, without listing a whole
    folder; None when it does not exist or holds none (open_dataset then says why)."""
    root = Path(path).expanduser()
    if root.is_file():
        return _kind(root)
    if not root.is_dir():
        return None
    for p in root.rglob("*"):
        kind = _kind(p) if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts) \
            else None
        if kind is not None:
            return kind
    return None


def _kind(path: Path) -> str | None:
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        return "images"
    if suffix in ARRAY_SUFFIXES:
        return "arrays"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    return None


def _stamp(paths: Sequence[Path], base: Path) -> str:
    """What a shard was made from: each file's path under the root, size and mtime (no content read)."""
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p.relative_to(base)}:{st.st_size}:{st.st_mtime_ns}|".encode())
    return h.hexdigest()[:16]


def _scan(files: list[Path], base: Path, on_error: str, scan_one) -> list[Shard]:
    """One shard per file via ``scan_one(path) -> (rows, ...)``; on "skip" a file it refuses becomes a bad
    shard, and only a dataset where every file is bad raises (the first file's error)."""
    shards, first_error = [], None
    for index, path in enumerate(files):
        rel = path.relative_to(base)
        try:
            scanned = scan_one(path)
        except InputError as exc:
            if on_error != "skip":
                raise
            first_error = first_error or exc
            shards.append(Shard(index, _shard_name(rel), (str(rel),), 0, _stamp([path], base),
                                BadInput(str(rel), exc.message, "scan")))
            continue
        rows, row_shapes = scanned if isinstance(scanned, tuple) else (scanned, ())
        shards.append(Shard(index, _shard_name(rel), (str(rel),), rows, _stamp([path], base), row_shapes=row_shapes))
    if first_error is not None and all(s.bad for s in shards):
        raise first_error
    return shards


def _shard_name(rel: Path) -> str:
    return str(rel.with_suffix("")).replace("/", "__")


def _image_shards(files: list[Path], base: Path, model: Model, per_shard: int) -> list[Shard]:
    if len(model.inputs) != 1:
        raise InputError(f"The model has {len(model.inputs)} inputs; an image folder feeds a model with one image "
                         "input.", "Write the inputs as .npz shards (one array per input) or parquet columns.")
    shards = []
    for index, start in enumerate(range(0, len(files), per_shard)):
        chunk = files[start:start + per_shard]
        shards.append(Shard(index, f"images-{index:05d}", tuple(str(p.relative_to(base)) for p in chunk),
                            len(chunk), _stamp(chunk, base)))
    return shards


#: numpy parses a .npy header with ast.literal_eval. CPython 3.11 keeps the AST constructor's recursion depth in
#: per-interpreter state, so two threads parsing at once can fail with "SystemError: AST constructor recursion depth
#: mismatch" (python/cpython#106905 and the reports linked there), and a `batch --ray` actor reads two units at
#: once, in threads. Every header, and every .npz load, here is parsed under this lock.
NPY_HEADER_LOCK = threading.Lock()


def read_npy_header(handle) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of the .npy array at ``handle``'s position (its magic string first), parsed
    under NPY_HEADER_LOCK; the handle is left at the first byte of the data."""
    version = np.lib.format.read_magic(handle)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    with NPY_HEADER_LOCK:
        return read(handle)


def _npy_rows(handle, where: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        shape, _, dtype = read_npy_header(handle)  # the header only, not the data
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"Cannot read {where}: it is not a valid .npy array ({exc}).",
                         "Write shards with numpy.save / numpy.savez.") from None
    if dtype.hasobject:
        raise InputError(f"{where} holds Python objects (pickled data), which onnxaccel does not load.",
                         "Save plain numeric arrays.")
    return tuple(shape), dtype


def _array_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    if path.suffix.lower() == ".npy":
        with open(path, "rb") as handle:
            return {"": _npy_rows(handle, str(path))}
    try:
        with zipfile.ZipFile(path) as archive:
            return {name[:-4]: _npy_rows(archive.open(name), f"{path}:{name}")
                    for name in archive.namelist() if name.endswith(".npy")}
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(f"Cannot read {path}: it is not a valid .npz file ({exc}).",
                         "Write shards with numpy.savez.") from None


def _array_shard(path: Path, base: Path, model: Model, columns: dict[str, str]
                 ) -> tuple[int, tuple[tuple[str, tuple[int, ...]], ...]]:
    """Rows of one .npy/.npz shard and its row shape per input, its arrays checked against the model's inputs
    (headers only)."""
    headers = _array_headers(path)
    rows = None
    row_shapes = []
    for spec in model.inputs:
        key = _array_key(path, headers, spec, columns, model)
        shape, dtype = headers[key]
        if not shape:
            raise InputError(f"{path} holds a scalar for input '{spec.name}'; a shard needs rows on axis 0.",
                             "Save arrays of shape [rows, ...].")
        _check_row_shape(spec, model, shape[1:], dtype, str(path))
        if rows is not None and shape[0] != rows:
            raise InputError(f"{path}: the arrays for the model's inputs have different row counts "
                             f"({rows} and {shape[0]}).", "Every array of a shard needs the same axis 0.")
        rows = shape[0]
        row_shapes.append((spec.name, tuple(int(d) for d in shape[1:])))
    return rows or 0, tuple(row_shapes)


def _array_key(path: Path, headers: dict, spec: TensorSpec, columns: dict[str, str], model: Model) -> str:
    if "" in headers:  # .npy: one array, one input
        if len(model.inputs) != 1:
            raise InputError(f"{path} is a .npy file, but the model has {len(model.inputs)} inputs.",
                             "Use .npz shards with one array per input (named after it).")
        return ""
    name = columns.get(spec.name, spec.name)
    if name in headers:
        return name
    if len(model.inputs) == 1 and len(headers) == 1 and spec.name not in columns:
        return next(iter(headers))
    raise InputError(f"{path} has no array '{name}' for input '{spec.name}' (it has: {', '.join(headers) or 'none'}).",
                     f"Name the arrays after the inputs, or map them: --column {spec.name}=ARRAY.")


def parquet_modules():
    """Import pyarrow and pyarrow.parquet (optional), or raise MissingDependencyError saying how to install them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingDependencyError("pyarrow", "parquet", "Reading and writing parquet") from exc
    return pa, pq


def _parquet_shard(pa_pq, path: Path, base: Path, model: Model, columns: dict[str, str],
                   id_column: str | None) -> tuple[int, tuple]:
    """Rows of one parquet shard and the row shape of its tensor columns per input (:func:`_parquet_row_shape`),
    its columns checked against the model's inputs."""
    pa, pq = pa_pq
    try:
        meta = pq.ParquetFile(path)
        schema = meta.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"Cannot read {path}: it is not a valid parquet file ({exc}).",
                         "Write it with pyarrow.parquet.write_table, pandas.to_parquet or Spark.") from None
    names = list(schema.names)
    for spec in model.inputs:
        column = columns.get(spec.name, spec.name)
        if column not in names:
            raise InputError(f"{path} has no column '{column}' for the model input '{spec.name}' "
                             f"(columns: {', '.join(names)}).",
                             f"Map a column to the input: --column {spec.name}=COLUMN.")
    if id_column is not None and id_column not in names:
        raise InputError(f"{path} has no id column '{id_column}' (columns: {', '.join(names)}).",
                         "Pass an existing column to --id-column, or leave it out (ids become FILE:ROW).")
    row_shapes = []
    for spec in model.inputs:
        column = columns.get(spec.name, spec.name)
        row = _parquet_row_shape(pa, meta, column, schema.field(column).type, spec, f"{path} column '{column}'")
        if row is not None:  # values are cast when read (rows.py): only the shape is checked here
            _check_row_shape(spec, model, row, np.dtype(spec.dtype), f"{path} column '{column}'")
            row_shapes.append((spec.name, row))
    return meta.metadata.num_rows, tuple(row_shapes)


def _parquet_row_shape(pa, meta, column: str, kind, spec: TensorSpec, where: str) -> tuple[int, ...] | None:
    """The per-row shape a tensor column gives: a ``fixed_shape_tensor``'s shape or nested ``fixed_size_list``
    sizes (from the schema), or the lengths of nested lists as deep as the input's rank less the batch axis where
    every row has the same (that column read); an InputError where they differ between rows. None for columns
    that bind nothing: numbers, image bytes, lists of another depth (flat lists take the bound per-row shape)."""
    if isinstance(kind, pa.FixedShapeTensorType):
        return tuple(int(d) for d in kind.shape)
    kind = kind.storage_type if isinstance(kind, pa.BaseExtensionType) else kind
    levels, inner = [], kind
    while pa.types.is_list(inner) or pa.types.is_large_list(inner) or pa.types.is_fixed_size_list(inner):
        levels.append(inner.list_size if pa.types.is_fixed_size_list(inner) else None)
        inner = inner.value_type
    if not levels or spec.shape is None or len(levels) != len(spec.shape) - 1:
        return None
    if None not in levels:
        return tuple(levels)
    import pyarrow.compute as pc

    values = meta.read(columns=[column]).column(column).combine_chunks()
    values = values.storage if isinstance(values.type, pa.BaseExtensionType) else values
    shape = []
    for size in levels:
        if size is None:
            lengths = pc.unique(pc.list_value_length(values).drop_null()).to_pylist()
            if len(lengths) > 1:
                raise InputError(f"{where}: rows hold lists of {' and '.join(map(str, sorted(lengths)[:2]))} values "
                                 f"at depth {len(shape) + 1}; a shard binds input '{spec.name}' to one shape.",
                                 "Write rows of one shape per parquet file (one file per length).")
            size = lengths[0] if lengths else 0
        shape.append(int(size))
        values = values.flatten()
    return tuple(shape)


def _check_row_shape(spec: TensorSpec, model: Model, row_shape: tuple, dtype: np.dtype, where: str) -> None:
    want = row_shape_of(model, spec.name)
    declared = tuple(spec.shape[1:]) if spec.shape else None
    if want is None and declared is not None and (len(row_shape) != len(declared) or any(
            isinstance(d, int) and d > 0 and d != got for d, got in zip(declared, row_shape))):
        text = "[" + ", ".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in declared) + "]"
        raise InputError(f"{where}: rows for input '{spec.name}' have shape {list(row_shape)}; the model takes "
                         f"{text} per row (its input {spec.shape_text()} without the batch axis).",
                         f"Save rows of shape {text} (? any size), one row per index of axis 0.")
    if want is not None and tuple(row_shape) != want:
        raise InputError(f"{where}: rows for input '{spec.name}' have shape {list(row_shape)}; the model takes "
                         f"{list(want)} per row (bound shape {list(model.input_shapes[spec.name])}).",
                         f"Save rows of shape {list(want)}, or bind the model's dims with --shape.")
    if not np.can_cast(dtype, np.dtype(spec.dtype), casting="safe"):
        raise InputError(f"{where}: input '{spec.name}' expects {spec.dtype}; the data is {dtype}.",
                         f"Save it as {spec.dtype}.")


def row_shape_of(model: Model, name: str) -> tuple[int, ...] | None:
    """The per-row shape of an input (its bound shape without axis 0), when the model is bound."""
    shape = model.input_shapes.get(name)
    return tuple(shape[1:]) if shape is not None else None
