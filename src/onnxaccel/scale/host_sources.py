"""Where a pipelined `batch` run (scale/pipeline.py) gets its rows on the host: read by the worker (into reused
page-locked slots where the GPU takes direct copies), or decoded by a DecodePool into shared memory; and the
helpers every source shares (a unit's files, its undecodable rows).
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from onnxaccel.engines.pool import pin_for_copies, unpin_for_copies
from onnxaccel.prepost.decode_pool import DecodePool
from onnxaccel.scale.datasets import BadInput, Unit, row_shape_of
from onnxaccel.scale.stages import StageTimes
from onnxaccel.scale.worker import BatchWorker, stopped_at

#: Page-locked bytes the read slots of a GPU job may take (fewer slots past it; at least depth + instances: the
#: reader may hold depth - 2 units started and wait for another while the runs hold instances - 1 and wait for it;
#: depth + instances - 3 slots or fewer hang).
PINNED_SLOTS_BYTES = 1 << 30
_PAGE = 4096


def _direct_copies(worker: BatchWorker, every: bool = False) -> str:
    """'' when the worker's instances copy page-locked rows straight into their bound device inputs (graph
    replay with direct copies: engines/pool.py), else why not. Host rows need one instance that does (the others
    join them on the host); device rows (``every``) need every instance to."""
    pool = worker.pool
    if not pool.target.is_gpu:
        return "joined on the host (CPU target)"
    have = [c is not None for c in pool.copiers]
    if not (pool.graph and (all(have) if every else any(have))):
        return "joined on the host (direct copies need graph capture in the target)"
    return ""


class _PinnedSlots:
    """Reused page-locked host buffers, a padded batch of every input per slot: rows are read straight into a
    slot and copied by DMA into the bound device inputs (RunnerPool's direct copies), with no host join and no
    freshly allocated (page-faulting) arrays per unit."""

    def __init__(self, worker: BatchWorker, count: int, layout: list[tuple[str, tuple[int, ...], np.dtype]],
                 slot_bytes: int):
        self.target = worker.pool.target
        self._base = np.empty(count * slot_bytes + _PAGE, np.uint8)
        offset = (-self._base.ctypes.data) % _PAGE
        self._raw = self._base[offset:offset + count * slot_bytes]
        self.buffers: list[dict[str, np.ndarray]] = []
        for k in range(count):
            at, slot = k * slot_bytes, {}
            for name, shape, dtype in layout:
                nbytes = int(np.prod(shape)) * dtype.itemsize
                slot[name] = self._raw[at:at + nbytes].view(dtype).reshape(shape)
                at += -(-nbytes // 64) * 64
            self.buffers.append(slot)
        self.free: queue.Queue[int] = queue.Queue()
        for k in range(count):
            self.free.put(k)
        self.reason = pin_for_copies(self.target, self._raw.ctypes.data, self._raw.nbytes)

    @classmethod
    def make(cls, worker: BatchWorker, depth: int) -> tuple[_PinnedSlots | None, str]:
        """Slots for ``worker`` reading ``depth`` units ahead (None where the GPU does not take direct copies, an
        input's row shape is not fixed, or pinning is refused) and what the job's copies to the device are."""
        why = _direct_copies(worker)
        if why:
            return None, why
        layout, slot_bytes = [], 0
        for spec in worker.model.inputs:
            rows = row_shape_of(worker.model, spec.name)
            dtype = np.dtype(spec.dtype)
            if rows is None or not all(isinstance(d, int) for d in rows) or dtype == np.dtype(object):
                return None, f"joined on the host (input '{spec.name}' has no fixed row shape)"
            shape = (worker.spec.batch, *rows)
            layout.append((spec.name, shape, dtype))
            slot_bytes += -(-int(np.prod(shape)) * dtype.itemsize // 64) * 64
        slot_bytes = max(_PAGE, -(-slot_bytes // _PAGE) * _PAGE)
        # Up to 2 x depth + instances are in use at once (started, ready, running); never fewer than depth +
        # instances (at depth + instances - 3 or fewer the reader waits for a slot that the runs, waiting for the
        # reader, never give back).
        instances = worker.planned_instances
        count = max(depth + instances, min(2 * depth + instances, PINNED_SLOTS_BYTES // slot_bytes))
        slots = cls(worker, count, layout, slot_bytes)
        if slots.reason:
            return None, f"joined on the host (page-locking the read slots failed: {slots.reason})"
        return slots, f"direct: rows read into {count} page-locked slots, copied by DMA into the bound inputs"

    def close(self) -> None:
        """Unpin (once nothing runs on the slots)."""
        if not self.reason:
            unpin_for_copies(self.target, self._raw.ctypes.data)
            self.reason = "closed"


class _ReaderSource:
    """Rows read by the worker, in the reader thread or (``threads`` > 1) by a pool of threads reading the units
    in flight at once: read seconds go to ``read`` (``decode`` for float images). With ``slots``, each unit is
    read into a free page-locked slot, given back once its run is done (``release``); waiting for a free one is
    ``wait_for_device``."""

    def __init__(self, worker: BatchWorker, threads: int = 1, slots: _PinnedSlots | None = None):
        self.worker = worker
        self.slots = slots
        self.threads = ThreadPoolExecutor(threads, thread_name_prefix="onnxaccel-batch-read") if threads > 1 else None

    def start(self, unit: Unit):
        slot, waited = None, 0.0
        if self.slots is not None:
            began = time.perf_counter()
            slot = self.slots.free.get()
            waited = time.perf_counter() - began
        out = self.slots.buffers[slot] if slot is not None else None
        future = self.threads.submit(self.worker.read, unit, out) if self.threads is not None else None
        return unit, future, slot, waited

    def finish(self, pending, times: StageTimes):
        unit, future, slot, waited = pending
        data = future.result() if future is not None else self.worker.read(
            unit, self.slots.buffers[slot] if slot is not None else None)
        times.wait_for_device_s += waited
        if self.worker.spec.dataset.kind == "images":
            times.decode_s += data[2]
        else:
            times.read_s += data[2]
        return unit, data, slot

    def release(self, slot) -> None:
        if slot is not None and self.slots is not None:
            self.slots.free.put(slot)

    def close(self) -> None:
        if self.threads is not None:
            self.threads.shutdown(wait=True, cancel_futures=True)
        if self.slots is not None:
            self.slots.close()


class _PoolSource:
    """Images decoded by a DecodePool into shared-memory slots, several units in flight."""

    def __init__(self, worker: BatchWorker, pool: DecodePool):
        self.worker, self.pool = worker, pool
        self._pinned: np.ndarray | None = None
        self.free: queue.Queue[int] = queue.Queue()
        for slot in range(pool.shape[0]):
            self.free.put(slot)

    def files(self, unit: Unit) -> tuple[list[str], list[str]]:
        """The unit's image files: as the shard names them (row ids, error rows) and as paths to open."""
        return _unit_files(self.worker, unit)

    def start(self, unit: Unit):
        slot = self.free.get()
        rels, paths = self.files(unit)
        return unit, slot, rels, self.pool.submit(slot, paths), time.perf_counter()

    def finish(self, pending, times: StageTimes):
        unit, slot, rels, futures, started = pending
        bad_rows: dict[int, str] = {}
        for future in futures:
            rows, seconds = future.result()
            bad_rows.update(rows)
            times.decode_s += seconds
        bad = _bad_rows(self.worker, unit, rels, bad_rows)
        feeds = {self.worker.model.inputs[0].name: self.pool.view(slot, unit.rows)}
        return unit, (rels, feeds, time.perf_counter() - started, bad), slot

    def pin(self) -> str:
        """Page-lock the decoders' shared memory where the GPU takes direct copies from it: what the job's copies
        to the device are."""
        why = _direct_copies(self.worker)
        if why:
            return why
        self._pinned = self.pool.ring
        reason = pin_for_copies(self.worker.pool.target, self._pinned.ctypes.data, self._pinned.nbytes)
        if reason:
            self._pinned = None
            return f"joined on the host (page-locking the decoders' shared memory failed: {reason})"
        return "direct: decoded into page-locked shared memory, copied by DMA into the bound inputs"

    def release(self, slot) -> None:
        if slot is not None:
            self.free.put(slot)

    def close(self) -> None:
        if self._pinned is not None:
            unpin_for_copies(self.worker.pool.target, self._pinned.ctypes.data)
            self._pinned = None
        self.pool.close()


def _unit_files(worker: BatchWorker, unit: Unit) -> tuple[list[str], list[str]]:
    """A unit's image files: as the shard names them (row ids, error rows) and as paths to open."""
    rels = list(worker.spec.dataset.shards[unit.shard].files[unit.start:unit.stop])
    return rels, [str(worker.reader._path(r)) for r in rels]


def _bad_rows(worker: BatchWorker, unit: Unit, rels: list[str], bad_rows: dict[int, str]) -> list[BadInput]:
    """Undecodable images of a unit (row = index within the unit) as BadInputs, or the job stopped at the first
    one (``--on-error stop``)."""
    if not bad_rows:
        return []
    if worker.spec.on_error != "skip":
        from onnxaccel.errors import InputError

        first = min(bad_rows)
        shard = worker.spec.dataset.shards[unit.shard]
        raise stopped_at(shard.name, rels[first], InputError(bad_rows[first], ""))
    return [BadInput(rels[i], bad_rows[i], "read", unit.start + i) for i in sorted(bad_rows)]
