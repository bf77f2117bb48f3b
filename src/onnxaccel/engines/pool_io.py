"""The host side of a RunnerPool: the capture gate, the instances' run turns, and joining batch parts into one
reused buffer.

Split from engines/pool.py (the pool itself), which uses and re-exports these names.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable

import numpy as np

class CaptureGate:
    """Graph captures exclusive against every GPU run of the process (a readers-writer lock, writers first).

    ONNX Runtime begins a capture with cudaStreamCaptureModeGlobal (onnxruntime cuda_graph.cc): while it lasts,
    CUDA calls from any other thread of the process fail, and so does the capture. Loading a graph-captured model
    while others serve (the repository API) would hit that; batches hold the gate shared, captures exclusive.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def shared(self):
        """Held by a run (or a CUDA call of ours) that may go alongside others but not during a capture."""
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        """Held by a capture: waits for the runs holding the gate, and holds new ones back until it is done."""
        with self._cond:
            self._writers_waiting += 1
            while self._writing or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


#: The process's gate: serve's GPU batches and every pool's warm-ups (bench's too) go through this one.
CAPTURE_GATE = CaptureGate()


class RunTurns:
    """Whether a pool's instances run one at a time (serve's ``--streams serial``) or side by side. One at a time,
    a lock is held around the run alone: an instance's copies in and out and its host work go on beside another's
    run, and on a GPU each run has the device to itself."""

    def __init__(self, one_at_a_time: bool):
        #: The turn a run takes; None: runs overlap.
        self.lock: threading.Lock | None = threading.Lock() if one_at_a_time else None

    def run(self, fn: Callable[[], object]) -> tuple[object, float]:
        """``fn()`` in its turn where runs take turns: its result and the seconds it waited for the turn."""
        if self.lock is None:
            return fn(), 0.0
        asked = time.perf_counter()
        with self.lock:
            waited = time.perf_counter() - asked
            return fn(), waited

    def phase(self, waited: float) -> dict[str, float]:
        """The batch phase ``turn`` (the wait for the run's turn) where runs take turns, else none."""
        return {"turn": waited} if self.lock is not None else {}


#: memmove that keeps the GIL (ctypes.memmove releases it, as numpy's copies do). See join_rows.
_memmove_holding_gil = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes.cast(ctypes.memmove, ctypes.c_void_p).value)


def join_rows(buffer: np.ndarray, values: list[np.ndarray], *, hold_gil: bool = True) -> None:
    """Copy ``values`` one after another into the first rows of ``buffer``; fill the rest with copies
    of the last row (padding: rows are independent, so the real rows' results are unchanged).

    In the server this runs in a run thread while the event loop thread holds the GIL most of the time.
    numpy releases the GIL for each large copy and must then wait to get it back (up to the switch interval
    each time): joining 64 rows of 600 kB that way took 52 ms instead of 8 ms while another thread ran
    Python (2-core development machine, switch interval 0.5 ms; benchmarks/history/serve_session_probe.py
    measures it on the GPU machine). memmove calls that keep the GIL (``hold_gil``) wait once per switch interval
    of copying instead of once per row. A pool's setting: where no event loop of the process decodes requests
    (serve's model process, whose loop only passes messages), releasing it lets several instances' joins and
    the loop run at the same time.
    """
    contiguous = buffer.flags.c_contiguous and buffer.dtype != np.dtype(object)
    copy = _memmove_holding_gil if hold_gil else ctypes.memmove
    at = 0
    for value in values:
        n = value.shape[0]
        if at + n > buffer.shape[0]:
            raise ValueError(f"the parts hold more than the buffer's {buffer.shape[0]} rows")
        if (contiguous and value.flags.c_contiguous and value.dtype == buffer.dtype
                and value.shape[1:] == buffer.shape[1:]):
            step = value.nbytes // n if n else 0
            copy(buffer.ctypes.data + at * step, value.ctypes.data, value.nbytes)
        else:
            buffer[at:at + n] = value
        at += n
    if at < buffer.shape[0]:
        buffer[at:] = buffer[at - 1]


def device_address(value) -> tuple[int, int] | None:
    """(device address, bytes) of a C-contiguous CUDA array given through ``__cuda_array_interface__`` (e.g. a torch
    tensor on the GPU: a decoder's batch handed on without a copy back to the host); None for anything else."""
    interface = getattr(value, "__cuda_array_interface__", None)
    if not isinstance(interface, dict):
        return None
    shape, typestr = tuple(interface.get("shape", ())), interface.get("typestr", "")
    itemsize = np.dtype(typestr).itemsize if typestr else 0
    strides = interface.get("strides")
    if strides is not None:  # C-contiguous strides are allowed to be given explicitly
        expected, step = [], itemsize
        for dim in reversed(shape):
            expected.insert(0, step)
            step *= dim
        if tuple(strides) != tuple(expected):
            return None
    return int(interface["data"][0]), int(np.prod(shape, dtype=np.int64)) * itemsize


def on_device(value) -> bool:
    """True for an array in device memory (``__cuda_array_interface__``), contiguous or not."""
    return isinstance(getattr(value, "__cuda_array_interface__", None), dict)


def to_host(value, why: str) -> np.ndarray:
    """``value`` as a host array: itself unless it lies in device memory (``__cuda_array_interface__``, strided
    too), which is copied back through its own library (torch's ``cpu()``, CuPy's ``get()``). ``why``: why the
    rows are not copied on the device, for the error where the library gives no way back."""
    if not on_device(value):
        return value
    if isinstance(value, np.ndarray):
        return np.asarray(value)
    for back in ("cpu", "get"):
        method = getattr(value, back, None)
        if callable(method):
            out = method()
            return out.numpy() if hasattr(out, "numpy") else np.asarray(out)
    raise ValueError(f"{why}: got rows in device memory ({type(value).__name__}) with no way to copy them to "
                     "the host (neither cpu() nor get())")


def real_rows(outputs: dict[str, np.ndarray], rows: int, size: int) -> dict[str, np.ndarray]:
    """The outputs of a batch padded from ``rows`` to ``size``, without the padding rows (views)."""
    if size == rows:
        return outputs
    return {n: (v[:rows] if v.ndim and v.shape[0] == size else v) for n, v in outputs.items()}
