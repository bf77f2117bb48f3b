"""The CPU decode pool of `batch` (prepost/decode.py ``cpu-pool``): worker processes decoding straight into a
shared-memory ring of batch slots (only file names and slot indices travel between processes, never pixels), and
optionally one process decoding with nvJPEG into the same ring (DecodePool ``gpu``).
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context, shared_memory

import numpy as np

from onnxaccel.inputs_files import ImagePreprocess
from onnxaccel.process_guard import exit_with_parent
from onnxaccel.prepost.cpu_decode import decode_files_into

#: What the GPU decoding process calls to make its decoder (DecodePool gpu_decoder): prepost/decode.py's
#: gpu_decoder.
GPU_DECODER = "onnxaccel.prepost.decode:gpu_decoder"


def pool_size() -> int:
    """Decoding processes: every core but one (the run and write threads need one), at least one."""
    return max(1, (os.cpu_count() or 1) - 1)


@dataclass
class Decoded:
    """Rows of one batch decoded into a slot: the pixels (a view of the slot) and per bad row its message."""

    pixels: np.ndarray
    bad: dict[int, str]
    seconds: float


# -- the CPU pool: worker processes writing into a shared-memory ring of batch slots ------------------------------

_WORKER: dict = {}


def _attach(name: str, shape: tuple[int, ...], height: int, width: int, pre: ImagePreprocess) -> None:
    """Worker initializer: map the shared ring once per process; end with the job if it is killed."""
    exit_with_parent()
    shm = shared_memory.SharedMemory(name=name)
    _WORKER.update(shm=shm, ring=np.ndarray(shape, np.uint8, buffer=shm.buf), height=height, width=width, pre=pre)


def _attach_gpu(name: str, shape: tuple[int, ...], height: int, width: int, pre: ImagePreprocess, device: int,
                decoder: str) -> None:
    """GPU process initializer: map the ring, make the decoder (``module:Class``, called (height, width, pre,
    device, batch=the ring's batch)); a decoder that cannot be made is kept as ``gpu_error`` (raised by
    ``_gpu_ready``)."""
    import importlib

    _WORKER["device"] = device
    _attach(name, shape, height, width, pre)
    module, _, cls = decoder.partition(":")
    try:
        _WORKER["gpu"] = getattr(importlib.import_module(module), cls)(height, width, pre, device, batch=shape[1])
    except Exception as exc:  # kept for _gpu_ready: a failed initializer only says the process "terminated abruptly"
        _WORKER["gpu_error"] = f"{type(exc).__name__}: {exc}"


def _gpu_ready() -> bool:
    """In the GPU process: True once its decoder is made; else raises why it could not be."""
    if "gpu_error" in _WORKER:
        from onnxaccel.errors import ProviderUnavailableError

        raise ProviderUnavailableError(
            f"The GPU JPEG decoder (nvJPEG) could not start on device {_WORKER.get('device', 0)}: "
            f"{_WORKER['gpu_error']}.", "Check the GPU with `onnxaccel doctor`, or pass --decoder cpu-pool.")
    return "gpu" in _WORKER


def _gpu_phases() -> dict[str, float]:
    return dict(getattr(_WORKER.get("gpu"), "phases", {}))


def _ready() -> bool:
    time.sleep(0.05)  # long enough that the pool spawns a process per task rather than reusing the first
    return "ring" in _WORKER


def _gpu_decode_into(slot: int, first: int, paths: list[str]) -> tuple[dict[int, str], float]:
    """In the GPU process: decode ``paths`` into rows ``first``.. of ``slot``."""
    start = time.perf_counter()
    view = _WORKER["ring"][slot, first:first + len(paths)]
    _, bad = _WORKER["gpu"].decode(paths, out=view)
    return {first + i: message for i, message in bad.items()}, time.perf_counter() - start


def _decode_into(slot: int, first: int, paths: list[str]) -> tuple[dict[int, str], float]:
    """In a worker: decode ``paths`` into rows ``first``.. of ``slot``; bad rows as {row: message}, and the
    seconds it took (the pipeline's decode stage time)."""
    start = time.perf_counter()
    bad = decode_files_into(paths, _WORKER["ring"][slot, first:first + len(paths)], _WORKER["height"],
                            _WORKER["width"], _WORKER["pre"])
    return {first + i: message for i, message in bad.items()}, time.perf_counter() - start




class DecodePool:
    """Decodes batches of image files into ``slots`` shared-memory batch buffers of [batch, H, W, 3] uint8.

    ``submit(slot, paths)`` returns futures of ({row: error}, seconds); ``view(slot)`` is the slot's array (valid until the
    slot is submitted again). ``workers=0`` decodes in the calling thread (the ``cpu`` decoder)."""

    def __init__(self, slots: int, batch: int, height: int, width: int, pre: ImagePreprocess,
                 workers: int | None = None, gpu: int | None = None, gpu_decoder: str = GPU_DECODER):
        """``gpu``: also start one process decoding with nvJPEG on that CUDA device into the same ring
        (``submit_gpu``); ``gpu_decoder`` names its decoder class as ``module:Class``."""
        self.shape = (slots, batch, height, width, 3)
        self.height, self.width, self.pre = height, width, pre
        self.workers = pool_size() if workers is None else workers
        self._shm = shared_memory.SharedMemory(create=True, size=max(1, int(np.prod(self.shape))))
        self.ring = np.ndarray(self.shape, np.uint8, buffer=self._shm.buf)
        self._pool = None
        if self.workers > 0:
            # spawn: a fork of a process holding ONNX Runtime / CUDA threads is unsafe.
            self._pool = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"), initializer=_attach,
                                             initargs=(self._shm.name, self.shape, height, width, pre))
        self._local_ready = False
        self._gpu = None
        if gpu is not None:
            # Its own process: decoding there shares no GIL with the job's run and write threads, and writes into
            # the same ring as the CPU pool (hybrid). It decodes no faster here than in the reader thread: in a
            # process of its own, its CUDA context and the model's take turns on the GPU (time-slicing;
            # benchmarks/history/nvjpeg_probe.py).
            self._gpu = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_attach_gpu,
                                            initargs=(self._shm.name, self.shape, height, width, pre, gpu,
                                                      gpu_decoder))

    @property
    def name(self) -> str:
        """The decoder's name as reports show it."""
        return "cpu-pool" if self._pool is not None else "cpu"

    def submit(self, slot: int, paths: list[str]) -> list[Future]:
        """Decode ``paths`` into ``slot`` (chunks spread over the workers): futures of ({row: error}, seconds)."""
        if self._pool is None:
            if not self._local_ready:
                _WORKER.update(ring=self.ring, height=self.height, width=self.width, pre=self.pre)
                self._local_ready = True
            done: Future = Future()
            done.set_result(_decode_into(slot, 0, paths))
            return [done]
        chunk = max(1, math.ceil(len(paths) / self.workers))
        return [self._pool.submit(_decode_into, slot, i, paths[i:i + chunk]) for i in range(0, len(paths), chunk)]

    def submit_gpu(self, slot: int, first: int, paths: list[str]) -> Future:
        """Decode ``paths`` with nvJPEG in the GPU process into rows ``first``.. of ``slot``: a future of
        ({row: error}, seconds)."""
        if self._gpu is None:
            raise RuntimeError("this DecodePool has no GPU process (pass gpu=DEVICE)")
        return self._gpu.submit(_gpu_decode_into, slot, first, paths)

    def gpu_phases(self) -> dict[str, float]:
        """The GPU process decoder's seconds per phase so far (NvjpegDecoder.phases; {} without one)."""
        return self._gpu.submit(_gpu_phases).result() if self._gpu is not None else {}

    def start(self) -> list[Future]:
        """Start every decoding process now (spawned: imports, and for the GPU process torchvision and a CUDA
        context: seconds) rather than at the first batch, without waiting: futures that finish when they are up
        (the GPU one raises what its process raised)."""
        started = [self._pool.submit(_ready) for _ in range(self.workers)] if self._pool is not None else []
        if self._gpu is not None:
            started.append(self._gpu.submit(_gpu_ready))
        return started

    def view(self, slot: int, rows: int) -> np.ndarray:
        """The first ``rows`` rows of ``slot``."""
        return self.ring[slot, :rows]

    def close(self) -> None:
        """Stop the workers and free the shared memory."""
        for pool in (self._pool, self._gpu):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._pool = self._gpu = None
        self.ring = None  # type: ignore[assignment]
        try:
            self._shm.close()
            self._shm.unlink()
        except (FileNotFoundError, BufferError):
            pass
