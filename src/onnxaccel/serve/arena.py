"""A decoding worker's arena (serve/model_link.py): anonymous shared memory (``memfd_create``) the worker passes
to the model process once, a ring of slots request tensors are copied into, or request bodies received into
(:class:`ArenaBody`, the ``allocate`` answer of http_protocol.py BodyIntake), so tensors never travel through the
socket.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import mmap
import os
import socket
import zlib

import numpy as np

#: Shared memory per worker for request tensors in flight (anonymous memory: touched pages count as the
#: worker's, shared with the model process), at least: 128 MiB holds ~200 ResNet-50 images (600 kB each).
ARENA_BYTES = 128 * 2**20
#: A worker's arena holds this many times what its in-flight budget (--max-inflight-mb) admits: every body the
#: budget lets in finds a slot, with room for the ring's gaps (slots come back roughly, not exactly, in order).
#: Below that, bodies past the arena went to the heap and their tensors travelled pickled through the model
#: socket, a much slower path for large requests (docs/BENCHMARKS.md, "Serve", has the A/B).
BUDGET_SHARE = 1.5
#: Arena slots start at multiples of this (cache lines; numpy views of any dtype stay aligned).
ALIGN = 64
#: A worker's arena begins with counters of the requests it has taken in (headers read) and not sent to the model
#: process yet, one int64 per slot, a model counting in slot ``arrival_slot(name)``: the model process's adaptive
#: queue delay reads them (serve/batcher.py), with no message per request. Each counter has one writer (the
#: worker's event loop); models sharing a slot only make a batch wait for the other's requests too.
ARRIVAL_SLOTS = 64
HEADER_BYTES = ARRIVAL_SLOTS * 8


def tensor_view(buffer, offset: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """The array at ``offset`` of an arena (either end's mapping of it)."""
    return np.ndarray(shape, dtype=np.dtype(dtype), buffer=buffer, offset=offset)


class Arena:
    """A ring of variable-sized slots in shared memory. Slots are taken at the head and returned in any
    order; space comes back when the oldest slots are returned (requests finish roughly in arrival order).
    ``alloc`` answers None when there is no room: the caller then sends the tensor inline. Slots lie after the
    first ``header`` bytes (a worker's arena: its arrival counters)."""

    def __init__(self, size: int, header: int = 0):
        self.size = size
        self.base = -(-header // ALIGN) * ALIGN
        self.fd = os.memfd_create("onnxaccel-arena", getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.ftruncate(self.fd, size)
            self.memory = mmap.mmap(self.fd, size)
        except OSError:
            os.close(self.fd)
            raise
        self._slots: collections.OrderedDict[int, list] = collections.OrderedDict()  # offset -> [end, returned]
        self._head = 0
        probe = np.frombuffer(self.memory, dtype=np.uint8, count=1)
        #: The mapping's address in this process (to tell whether an array's data lies in the arena).
        self.address = probe.ctypes.data
        del probe

    def alloc(self, nbytes: int) -> int | None:
        """Take a slot of at least ``nbytes`` (aligned) and return its offset, or None when there is no room."""
        n = -(-max(nbytes, 1) // ALIGN) * ALIGN
        if self.base + n > self.size:
            return None
        if not self._slots:
            start = self.base
        else:
            tail = next(iter(self._slots))
            if self._head > tail:  # live region [tail, head): room at the end, else at the start
                start = self._head if self._head + n <= self.size else (self.base if self.base + n <= tail
                                                                                    else None)
            else:  # wrapped (or full when head == tail): room only in [head, tail)
                start = self._head if self._head + n <= tail else None
            if start is None:
                return None
        self._slots[start] = [start + n, False]
        self._head = start + n
        return start

    def free(self, offset: int) -> None:
        """Return the slot at ``offset``; space is reclaimed once the oldest slots are returned."""
        slot = self._slots.get(offset)
        if slot is not None:
            slot[1] = True
        while self._slots and next(iter(self._slots.values()))[1]:
            self._slots.popitem(last=False)

    @property
    def used(self) -> int:
        """Slots currently taken."""
        return len(self._slots)

    def close(self) -> None:
        """Unmap the shared memory and close its file descriptor."""
        with contextlib.suppress(BufferError, ValueError):
            self.memory.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


#: The arena body of the request the current task handles (set around the request by BodyIntake's wrapper).
_CURRENT_BODY: contextvars.ContextVar[ArenaBody | None] = contextvars.ContextVar("onnxaccel_arena_body",
                                                                                 default=None)


class ArenaBody:
    """A request body received straight into an arena slot (the ``allocate`` answer of http_protocol.BodyIntake).
    Tensors decoded from it are views of the slot: :meth:`ModelLink._place` sends them by offset. The slot is
    freed when its last user is done: the request itself (``close``) and every message that points into it
    (answered, or lost with the model process)."""

    __slots__ = ("arena", "slot", "start", "end", "view", "users")
    #: Shared memory: a body still arriving after http_protocol.ARENA_HOLD_S moves to the heap (the ring would block).
    shared = True

    def __init__(self, arena: Arena, slot: int, start: int, size: int):
        self.arena, self.slot, self.start, self.end = arena, slot, start, start + size
        self.view = memoryview(arena.memory)[start:start + size]
        self.users = 1

    def handed(self) -> memoryview:
        """The body, for the app (its tensors are views of the arena)."""
        return self.view

    @contextlib.contextmanager
    def bind(self):
        """Mark this body as the current task's while its request is handled."""
        token = _CURRENT_BODY.set(self)
        try:
            yield
        finally:
            _CURRENT_BODY.reset(token)

    def close(self) -> None:
        """The request is over."""
        self.unref()

    def unref(self) -> None:
        """One user is done (the request, or an answered message); the last one frees the slot."""
        self.users -= 1
        if self.users == 0:
            self.arena.free(self.slot)

    def offset_of(self, value: np.ndarray) -> int | None:
        """The arena offset of ``value``'s data when it lies in this body (C-contiguous), else None."""
        if not value.flags.c_contiguous:
            return None
        offset = value.__array_interface__["data"][0] - self.arena.address
        return offset if self.start <= offset and offset + value.nbytes <= self.end else None


def arena_bytes(inflight_bytes: int = 0) -> int:
    """A worker's arena size for an in-flight budget of ``inflight_bytes`` (whole pages, at least ARENA_BYTES)."""
    page = mmap.PAGESIZE
    return max(ARENA_BYTES, -(-int(inflight_bytes * BUDGET_SHARE) // page) * page)


def arrival_slot(name: str) -> int:
    """The arrival counter of model ``name`` (the same in every process: not Python's salted hash)."""
    return zlib.crc32(name.encode()) % ARRIVAL_SLOTS


def arrival_counts(memory) -> np.ndarray:
    """The arrival counters at the start of a worker's arena (either end's mapping of it), as int64."""
    return np.ndarray((ARRIVAL_SLOTS,), np.int64, buffer=memory, offset=0)


def _arena(size: int = ARENA_BYTES) -> Arena | None:
    if not hasattr(os, "memfd_create") or not hasattr(socket, "send_fds"):
        return None  # not Linux: tensors travel inside the messages
    try:
        return Arena(size, header=HEADER_BYTES)
    except OSError:
        return None
