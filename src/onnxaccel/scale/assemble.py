"""Gather unit results into whole shards, prove that every row came back exactly once, and write each shard
when its last row arrives.

Runners hand over rows in any order (Ray returns units as actors finish them, and retries a unit whose actor
died). A row that arrives twice, or a shard written with a row missing, would be silent data corruption, so both
are errors here rather than something a test has to catch.

A bad row (an input that could not be read, ``--on-error skip``) counts as arrived: its outputs are dropped and
its error goes into the shard's record, so a shard is written (its good rows) once every row is accounted for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.errors import OnnxAccelError
from onnxaccel.scale.datasets import BadInput, Dataset
from onnxaccel.scale.writer import OutputStore, ShardRecord


class RowAccountingError(OnnxAccelError):
    """A row came back twice, or a shard ended with rows missing: a bug, never written to disk."""


@dataclass
class _Pending:
    rows: int
    filled: np.ndarray
    ids: list[str | None]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    bad: dict[int, BadInput] = field(default_factory=dict)


class ShardAssembler:
    """Collects unit results, which arrive in any order, into whole shards and writes each once complete."""
    def __init__(self, dataset: Dataset, store: OutputStore, on_shard: Callable[[ShardRecord], None] | None = None):
        self.dataset = dataset
        self.store = store
        self.on_shard = on_shard
        self.pending: dict[int, _Pending] = {}
        self.written: list[ShardRecord] = []

    def add(self, shard: int, rows: np.ndarray, row_ids: list[str], outputs: dict[str, np.ndarray],
            bad: list[BadInput] | None = None) -> None:
        """Rows ``rows`` (indices within the shard) of shard ``shard``, with their ids and outputs; the rows named
        in ``bad`` have no outputs worth keeping (their rows of ``outputs`` are dropped; ``outputs`` may be empty,
        else each output has one row per row of ``rows``)."""
        spec = self.dataset.shards[shard]
        pending = self.pending.get(shard)
        if pending is None:
            pending = self.pending[shard] = _Pending(spec.rows, np.zeros(spec.rows, bool), [None] * spec.rows)
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= spec.rows):
            raise RowAccountingError(f"Shard {spec.name} got row {int(rows.max())}; it has {spec.rows} rows.",
                                     "This is a bug in onnxaccel; please report it.")
        # A unit is usually a run of consecutive rows: slices then, and no sort to find repeats (the writer thread
        # does this per unit; its Python time is the job's when the writer is the busiest stage).
        run = rows.size > 0 and int(rows[-1]) - int(rows[0]) + 1 == rows.size and bool(np.all(np.diff(rows) == 1))
        where = slice(int(rows[0]), int(rows[-1]) + 1) if run else rows
        if pending.filled[where].any() or (not run and len(np.unique(rows)) != len(rows)):
            raise RowAccountingError(f"Shard {spec.name}: row(s) {rows[pending.filled[rows]][:5].tolist()} came back "
                                     "twice.", "This is a bug in onnxaccel; please report it.")
        if len(row_ids) != rows.size:
            raise ValueError(f"{len(row_ids)} row ids for {rows.size} rows")
        for item in bad or ():
            pending.bad[int(item.row)] = item
        good = np.array([r not in pending.bad for r in rows.tolist()], bool) if pending.bad else None
        for name, value in outputs.items():
            if value.ndim == 0 or value.shape[0] != rows.size:  # never broadcast one row over many, nor cut rows
                raise RowAccountingError(
                    f"Shard {spec.name}: output '{name}' has {value.shape[0] if value.ndim else 'no'} row(s) for "
                    f"{rows.size} input row(s).", "This is a bug in onnxaccel; please report it.")
            buffer = pending.outputs.get(name)
            if buffer is None:
                buffer = pending.outputs[name] = np.empty((spec.rows, *value.shape[1:]), value.dtype)
            if good is None:
                buffer[where] = value
            else:
                buffer[rows[good]] = value[good]
        if run:
            pending.ids[where] = row_ids
        else:
            for r, row_id in zip(rows.tolist(), row_ids):
                pending.ids[r] = row_id
        pending.filled[where] = True
        if pending.filled.all():
            self._write(shard)

    def _write(self, shard: int) -> None:
        spec = self.dataset.shards[shard]
        pending = self.pending.pop(shard)
        if pending.bad:
            keep = np.array([r not in pending.bad for r in range(spec.rows)], bool)
            rows = np.flatnonzero(keep)
            outputs = {k: v[keep] for k, v in pending.outputs.items()} if rows.size else {}
            ids = [pending.ids[r] for r in rows]
        else:  # every row good: the buffers and ids as they are, no copies
            rows, outputs, ids = np.arange(spec.rows), pending.outputs, pending.ids
        record = self.store.write(spec.name, spec.index, spec.fingerprint, ids, outputs,
                                  rows=rows, rows_in=spec.rows,
                                  errors=[pending.bad[r] for r in sorted(pending.bad)])
        self.written.append(record)
        if self.on_shard is not None:
            self.on_shard(record)

    def check_complete(self) -> None:
        """After the runner ends: no shard may be left with rows missing."""
        if self.pending:
            shard, pending = next(iter(self.pending.items()))
            missing = np.flatnonzero(~pending.filled)
            raise RowAccountingError(
                f"Shard {self.dataset.shards[shard].name} ended with {missing.size} row(s) missing "
                f"(first: {missing[:5].tolist()}).", "This is a bug in onnxaccel; please report it.")
