"""Fast image decoding for `batch`: uint8 HWC pixels at the preset's geometry, decoded at reduced size.

Why: decoding a 500x375 JPEG at full size and then shrinking it to 224 spends most of its time on pixels that
are thrown away. libjpeg scales by 1/2, 1/4 or 1/8 inside the inverse DCT; Pillow exposes it as
``Image.draft(mode, size)``, which picks the largest reduction that still leaves the image at least ``size``
(Pillow docs, Image.draft). The preset's geometry (inputs_files.read_pixels: imagenet resize + center crop, yolo
letterbox, scale01/none resize) then runs on the smaller image. The DCT-scaled pixels differ slightly from a full
decode + resize (tests/prepost/test_decode.py measures and bounds the difference on real photographs).

Decoders, chosen by :func:`choose_decoder`:

- ``nvjpeg``: NVIDIA nvJPEG, batched on the GPU, through NVIDIA DALI (prepost/dali.py: read, decode and geometry
  in DALI's threads), nvImageCodec (``nvidia.nvimgcodec``: the GPU's hardware JPEG decoder where it has one) or
  torchvision.io.decode_jpeg(device="cuda"), the first installed (``--decoder dali|nvimgcodec|torchvision`` names
  one); the geometry with torch on the GPU (DALI: its own); in the job's own process (scale/pipeline.py) or in
  one of its own (DecodePool ``gpu``). Used automatically on CUDA targets where torch with CUDA and a library
  import; never required. Run on the H200 (issue 22), never on this machine (no GPU here; DALI's and
  nvImageCodec's CPU backends run here in tests).
- ``hybrid``: nvJPEG and the CPU pool together, each batch split by their rates (no faster than ``nvjpeg``
  alone on the H200: not chosen automatically).
- ``cpu-pool``: worker processes (os.cpu_count()) decoding straight into a shared-memory batch buffer: only
  file names and slot indices travel between processes, never pixels.
- ``cpu``: the same decode in the calling thread (one core, or a pool that could not start).

AMD (rocJPEG/rocAL) is not wired: no AMD GPU exists here to check it on.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context, shared_memory
from pathlib import Path
from typing import BinaryIO

import numpy as np

from onnxaccel.errors import InputError
from onnxaccel.inputs_files import ImagePreprocess, apply_geometry, pillow
from onnxaccel.prepost.dali import dali_missing
from onnxaccel.prepost.resample import BatchResampler

logger = logging.getLogger(__name__)

#: The environment variable naming the library nvJPEG is called through (NvjpegDecoder.LIBRARY), and its values.
LIBRARY_ENV = "ONNXACCEL_NVJPEG_LIBRARY"
LIBRARIES = ("auto", "dali", "nvimgcodec", "torchvision")
#: --decoder's values: a library's name is nvjpeg through that library.
DECODERS = ("auto", "hybrid", "nvjpeg", *LIBRARIES[1:], "cpu-pool", "cpu")
#: The libraries as reports name them.
LIBRARY_NAMES = {"dali": "DALI", "nvimgcodec": "nvImageCodec", "torchvision": "torchvision",
                 "cpu": "the CPU (Pillow)"}
#: The decoders that need nvJPEG (torch with CUDA, and DALI, nvImageCodec or torchvision).
GPU_DECODERS = ("nvjpeg", "hybrid")
#: nvImageCodec's backend kinds by the names NvjpegDecoder.BACKENDS uses: the GPU's hardware JPEG engine (A100,
#: H100/H200: baseline JPEG only), nvJPEG's CUDA decoder, its hybrid CPU/GPU decoder, the CPU (libjpeg-turbo).
NVJPEG_BACKENDS = {"hw": "HW_GPU_ONLY", "gpu": "GPU_ONLY", "hybrid": "HYBRID_CPU_GPU", "cpu": "CPU_ONLY"}
#: What the GPU decoding process calls to make its decoder (DecodePool gpu_decoder): gpu_decoder below.
GPU_DECODER = "onnxaccel.prepost.decode:gpu_decoder"


def draft_size(size: tuple[int, int], height: int, width: int, pre: ImagePreprocess) -> tuple[int, int]:
    """The smallest (width, height) the image (``size`` = width, height) may be decoded at so that the preset's
    geometry still only shrinks it: the resized size before the crop (imagenet), the letterboxed size (yolo),
    or the target size (scale01/none)."""
    w0, h0 = size
    if pre.preset == "imagenet":
        short = pre.resize or round(min(height, width) * 256 / 224)
        scale = short / min(w0, h0)
    elif pre.preset == "yolo":
        scale = min(height / h0, width / w0)
    else:
        return width, height
    return max(1, math.ceil(w0 * scale)), max(1, math.ceil(h0 * scale))


def decode_pixels(path: Path | BinaryIO, height: int, width: int, pre: ImagePreprocess, *,
                  reduced: bool = True) -> np.ndarray:
    """uint8 RGB pixels [height, width, 3] by the preset's geometry (read_pixels semantics); JPEGs decoded at
    reduced size (libjpeg DCT scaling) where the target is smaller, unless ``reduced`` is False."""
    Image = pillow()
    try:
        with Image.open(path) as img:
            if reduced and img.format == "JPEG":
                img.draft("RGB", draft_size(img.size, height, width, pre))
            img = img.convert("RGB")
            img, _ = apply_geometry(img, height, width, pre)
            return np.asarray(img, dtype=np.uint8)
    except OSError as exc:
        raise InputError(f"Cannot read image {path}: {exc}", "Check that the file is a valid image.") from exc


def choose_decoder(device: str, wanted: str = "auto", guard=None) -> tuple[str, str]:
    """The decoder to use on a ``device`` target ("cpu", "cuda", ...) and why: ``wanted`` unless "auto"; auto is
    nvjpeg where torch with CUDA and nvImageCodec or torchvision import and the target is CUDA, else the CPU pool
    (or one thread on a one-core machine). ``guard``: a context the CUDA probe runs in (``batch`` passes its
    capture gate: no CUDA call of another thread while ONNX Runtime captures a graph)."""
    if wanted not in DECODERS:
        raise InputError(f"--decoder must be one of {', '.join(DECODERS)}, got '{wanted}'.",
                         "auto picks nvJPEG (through DALI, nvImageCodec or torchvision, the first installed) where "
                         "torch with CUDA is installed and the target is CUDA, else a CPU process pool.")
    if wanted in LIBRARIES[1:]:  # nvjpeg through this library: for this process and the processes it starts
        previous = NvjpegDecoder.LIBRARY, os.environ.get(LIBRARY_ENV)
        NvjpegDecoder.LIBRARY = os.environ[LIBRARY_ENV] = wanted
        try:
            _nvjpeg_or_raise(wanted, guard)
        except InputError:  # nothing changes for the next job of this process
            NvjpegDecoder.LIBRARY = previous[0]
            if previous[1] is None:
                os.environ.pop(LIBRARY_ENV, None)
            else:
                os.environ[LIBRARY_ENV] = previous[1]
            raise
        return "nvjpeg", f"asked for; through {nvjpeg_library()}"
    if wanted in GPU_DECODERS:
        _nvjpeg_or_raise(wanted, guard)
        return wanted, f"asked for; through {nvjpeg_library()}"
    if wanted != "auto":
        return wanted, "asked for"
    if device in ("cuda", "tensorrt"):
        reason = nvjpeg_missing(guard)
        if not reason:
            return "nvjpeg", f"nvJPEG through {nvjpeg_library()} on the CUDA target"
        note = f"nvJPEG not used: {reason}"
    else:
        note = f"the target is {device}, not a CUDA GPU"
    if (os.cpu_count() or 1) > 1:
        return "cpu-pool", f"{note}; {pool_size()} decoding processes"
    return "cpu", f"{note}; one core"


def _nvjpeg_or_raise(asked: str, guard=None) -> None:
    """Raise InputError (what, and what to install) where ``--decoder asked`` cannot run nvJPEG here."""
    reason = nvjpeg_missing(guard)
    if not reason:
        return
    library = _library()
    if reason == "torch sees no CUDA device":
        fix = "Check the GPU and its driver with `onnxaccel doctor`"
    elif library == "dali":
        fix = "Install DALI (pip install onnxaccel[dali-cu13])"
    elif library == "nvimgcodec":
        fix = "Install nvImageCodec (pip install onnxaccel[nvimgcodec-cu13], or -cu12)"
    elif library == "torchvision" and NvjpegDecoder.LIBRARY == "torchvision":
        fix = "Install torchvision with CUDA"
    else:
        fix = ("Install torch with CUDA and " if reason.startswith("torch is not installed") else "Install ") + (
            "nvImageCodec (pip install onnxaccel[nvimgcodec-cu13], or -cu12), DALI (onnxaccel[dali-cu13]) or "
            "torchvision with CUDA")
    if asked == "nvjpeg" and os.environ.get(LIBRARY_ENV, "auto") != "auto":
        fix += f", or unset {LIBRARY_ENV} (it is '{os.environ[LIBRARY_ENV]}')"
    raise InputError(f"--decoder {asked} cannot run here: {reason}.", f"{fix}, or pass --decoder auto.")


def nvjpeg_missing(guard=None) -> str:
    """'' when nvJPEG can decode here (through the library _library resolves to: DALI, nvImageCodec or torchvision's
    GPU decode_jpeg; torch with CUDA in every case), else why not. DALI and nvImageCodec are found, not imported;
    torchvision is imported last (seconds: its models and datasets). ``guard``: a context for the one CUDA call
    (torch.cuda.is_available)."""
    try:
        import torch
    except ImportError as exc:
        return f"torch is not installed ({exc.name})"
    with guard() if guard is not None else contextlib.nullcontext():
        available = torch.cuda.is_available()
    if not available:
        return "torch sees no CUDA device"
    library = NvjpegDecoder.LIBRARY
    if library not in LIBRARIES:
        return f"ONNXACCEL_NVJPEG_LIBRARY must be {', '.join(LIBRARIES[:-1])} or {LIBRARIES[-1]}, not '{library}'"
    if library == "dali" or _library() == "dali":
        return dali_missing()
    if library != "torchvision":
        missing = nvimgcodec_missing()
        if not missing or library == "nvimgcodec":
            return missing
    missing = torchvision_missing()
    if missing and library == "auto":
        return f"neither DALI nor nvImageCodec nor torchvision is installed ({missing})"
    return missing


def torchvision_missing() -> str:
    """'' when torchvision with io.decode_jpeg imports here, else why not (imported: it costs seconds)."""
    try:
        import torchvision.io as tio
    except ImportError as exc:
        return f"torchvision is not installed ({exc.name})"
    if not hasattr(tio, "decode_jpeg"):
        return "this torchvision has no io.decode_jpeg"
    return ""


def _import_nvimgcodec():
    """``nvidia.nvimgcodec``, its per-file error messages off (PYNVIMGCODEC_VERBOSITY, read at import: bad files
    become the job's error rows with their own message), and what its import prints about optional codec
    libraries in the debug log."""
    import importlib

    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
    if "nvidia.nvimgcodec" in sys.modules:
        return sys.modules["nvidia.nvimgcodec"]
    with _native_stderr_to_log("nvImageCodec"):
        return importlib.import_module("nvidia.nvimgcodec")


#: One redirection of file descriptor 2 at a time: two decoding threads making decoders at once would otherwise
#: restore each other's saved descriptor and leave stderr pointing at a deleted temporary file.
_STDERR_LOCK = threading.RLock()


@contextlib.contextmanager
def _native_stderr_to_log(what: str):
    """Send what native code writes to file descriptor 2 inside the block to the log (debug) instead of the
    terminal: nvImageCodec's extensions print "Failed to load nvjpeg2k library! ..." for every optional codec
    library not installed (JPEG 2000, TIFF), which a JPEG job does not need. The descriptor is the process's: what
    another thread writes to stderr meanwhile goes to the log too; blocks in several threads take turns."""
    import tempfile

    with _STDERR_LOCK:
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile(mode="w+b") as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                sink.seek(0)
                text = sink.read().decode(errors="replace").strip()
                if text:
                    logger.debug("%s wrote to stderr: %s", what, text)


def nvjpeg_library() -> str:
    """The library nvJPEG is called through here: "DALI", "nvImageCodec" or "torchvision"."""
    library = _library()
    return LIBRARY_NAMES.get(library, library)


def _library(without_dali: bool = False) -> str:
    """ONNXACCEL_NVJPEG_LIBRARY resolved: "dali", "nvimgcodec" or "torchvision". auto: DALI where installed beside
    nvImageCodec or torchvision (DALI's batches that fail, and files that are not JPEG, go through one of them), else
    nvImageCodec, else torchvision. ``without_dali``: the library DaliDecoder's fallback uses.

    Why DALI first (issue 22, eighth session, H200, 10,000 photographs at batch 64, one lease): 10,914-11,675
    rows/s inside `batch` against torchvision's 8,151 and nvImageCodec's 6,272, with pixels as close to Pillow's as
    nvImageCodec's (DaliDecoder.FANCY_UPSAMPLING: PSNR 56.5 dB at the 224 input, nvImageCodec 56.3 dB)."""
    library = NvjpegDecoder.LIBRARY
    if (library == "auto" and not without_dali and not _DALI_FAILED and not dali_missing()
            and _fallback_library_found()):
        return "dali"
    if library == "auto" or (library == "dali" and without_dali):
        return "nvimgcodec" if not nvimgcodec_missing() else "torchvision"
    return library


#: Why DALI could not start in this process when `auto` chose it (gpu_decoder): `auto` then goes on without it.
_DALI_FAILED: list[str] = []


def dali_failed() -> str:
    """Why DALI could not start when `auto` chose it in this process ('' when it did, or was not chosen)."""
    return _DALI_FAILED[-1] if _DALI_FAILED else ""


def _fallback_library_found() -> bool:
    """nvImageCodec or torchvision is installed (found, not imported: torchvision's import takes seconds)."""
    import importlib.util

    return not nvimgcodec_missing() or importlib.util.find_spec("torchvision") is not None


#: Decoding threads in the job's process per library (each with its own decoder; torchvision's decode holds one
#: process-wide lock, its reads and geometry run beside it). Measured on the H200 (issue 22, seventh session, batch
#: 64, 10,000 JPEGs, same lease): torchvision 3 threads 6,665 rows/s against 6,178 with 2; DALI 3 pipelines 6,525
#: against 6,160 with 2 and 5,838 with 4; nvImageCodec 1 thread 3,924, 2 threads 4,165, 4 threads 3,236.
DECODE_THREADS = {"nvimgcodec": 2, "torchvision": 3, "dali": 3}


def gpu_decode_threads() -> int:
    """How many decoding threads the job runs for the GPU decoder this process would make (DECODE_THREADS)."""
    return DECODE_THREADS.get(_library(), 2)


def gpu_decoder(height: int, width: int, pre: ImagePreprocess, device: int = 0, batch: int = 64):
    """The GPU decoder for batches of up to ``batch`` images (DALI builds its pipeline for that size): DALI's
    pipeline where the library resolves to it (_library: file reads, decode and geometry in DALI's threads,
    without the GIL), else NvjpegDecoder (nvImageCodec, else torchvision)."""
    if _library() == "dali":
        from onnxaccel.prepost.dali import DaliDecoder

        try:
            return DaliDecoder(height, width, pre, device, batch)
        except Exception as exc:  # noqa: BLE001 - auto's choice goes on without DALI; asked for, it fails
            if NvjpegDecoder.LIBRARY != "auto":
                raise
            _DALI_FAILED.append(f"{type(exc).__name__}: {exc}")
            logger.warning("DALI could not start (%s): nvJPEG through %s instead.", _DALI_FAILED[-1],
                           nvjpeg_library())
    return NvjpegDecoder(height, width, pre, device)


@functools.lru_cache(maxsize=64)
def _warm_up_jpeg(height: int, width: int) -> bytes:
    """A baseline JPEG of a colour gradient, ``height`` x ``width`` (made once per size: every decoding thread's
    warm-up takes the same files, up to a batch of 256 photograph-sized ones for DALI)."""
    import io

    pixels = np.add.outer(np.arange(height), np.arange(width))[:, :, None] * np.array([1, 2, 3]) % 256
    buffer = io.BytesIO()
    pillow().fromarray(pixels.astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def nvimgcodec_missing() -> str:
    """'' when nvImageCodec (NVIDIA's codec library, PyPI nvidia-nvimgcodec-cu12/-cu13) is installed here, else
    why not. Found, not imported: its import prints to the process's stderr (see _import_nvimgcodec), and this
    check may run in a thread beside others; the decoder imports it when it is made."""
    import importlib.util

    try:
        found = importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except (ImportError, ValueError):
        found = False
    return "" if found else "nvImageCodec is not installed (nvidia.nvimgcodec)"


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
    """Worker initializer: map the shared ring once per process."""
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


def decode_files_into(paths: list[str], out: np.ndarray, height: int, width: int,
                      pre: ImagePreprocess) -> dict[int, str]:
    """Decode ``paths`` on the CPU (decode_pixels) into rows 0.. of ``out``; a file that cannot be decoded is a zero
    row, its message under its row in the returned {row: message}."""
    bad = {}
    for i, path in enumerate(paths):
        try:
            out[i] = decode_pixels(path, height, width, pre)
        except InputError as exc:
            out[i] = 0
            bad[i] = exc.message
    return bad


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
            # the same ring as the CPU pool (hybrid). On the H200 it decoded at the same third of its isolated
            # rate as in the reader thread (issue 22): in a process of its own, its CUDA context and the model's take
            # turns on the GPU (time-slicing; benchmarks/nvjpeg_probe.py).
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


class NvjpegDecoder:
    """Batched JPEG decode on an NVIDIA GPU (nvJPEG), then the preset's geometry with torch on the GPU, copied back
    as uint8 NHWC. Non-JPEG files fall back to :func:`decode_pixels`. nvJPEG through nvImageCodec where installed
    (``Decoder(device_id).decode(code_streams, params=, cuda_stream=)``: every backend allowed, the hardware
    decoder first; images with ``__cuda_array_interface__``, None where a file cannot be decoded), else through
    torchvision's documented API (decode_jpeg accepts a list of uint8 tensors and a device).

    Measured on the H200 (issue 22, 10,000 photographs at ~500x375, ResNet-50's 224): resizing and copying back
    image by image (a device sync per image) gave 4,985 images/s; so images of one size are resized together, the
    batch is stacked on the device and copied back once, through a page-locked buffer, on a stream of its own
    (the model's runs keep theirs)."""

    name = "nvjpeg"
    #: The decoding stream's priority (torch: 0 the default, -1 high): above the model's streams, its kernels are
    #: scheduled first when both wait for the GPU.
    STREAM_PRIORITY = 0

    #: Which library calls nvJPEG: "auto" (_library: DALI, else nvImageCodec, else torchvision), "dali"
    #: (gpu_decoder makes prepost/dali.py's DaliDecoder; this class then serves its other files and failed
    #: batches), "nvimgcodec" or "torchvision"; the environment's ONNXACCEL_NVJPEG_LIBRARY or --decoder
    #: dali|nvimgcodec|torchvision sets it. On the H200 (issue 22, eighth session, 200 photographs against Pillow,
    #: benchmarks/i22_pixels.py) nvImageCodec's whole images are within 1 level of Pillow's (PSNR 82.7 dB),
    #: torchvision's up to 58 levels off (43.2 dB: the hardware decoder's chroma upsampling, without
    #: interpolation); inside `batch` at batch 64 nvImageCodec ran 5,272 rows/s, torchvision 8,151, DALI 11,169.
    LIBRARY = os.environ.get(LIBRARY_ENV, "auto")
    #: nvImageCodec's backends, in order (names of NVJPEG_BACKENDS; empty: every backend, the library's choice);
    #: the CPU threads of each decoder's executor (0: the library's default, one per core) and its options string
    #: (nvImageCodec's "Decoder options format", e.g. ``nvjpeg_hw_decoder:preallocate_batch_size=64``). A file a
    #: restricted set cannot decode is decoded again with every backend before it counts as bad.
    #: CPU_THREADS is 2: nvImageCodec makes an nvJPEG decoder per executor thread (one per core by default), one
    #: after another under a lock; warmed up with one per core a decoder took 16 s longer to start on the H200,
    #: with 2 threads 1.6 s (issue 22, sixth session: 3,048 rows/s warmed against 2,627 cold with the default).
    BACKENDS: tuple[str, ...] = ()
    CPU_THREADS = 2
    OPTIONS = ""
    #: Small JPEGs decoded when the decoder is made (warm_up; 0: none).
    WARM_UP = 64
    #: The preset's geometry: "matmul" (prepost/resample.py BatchResampler: the whole batch as two batched matrix
    #: products, ~n + 12 GPU operations) or "groups" (F.interpolate once per image size, ~8 operations a size).
    GEOMETRY = "matmul"

    def __init__(self, height: int, width: int, pre: ImagePreprocess, device: int = 0, *, warm: bool = True):
        import torch

        self.torch = torch
        self.height, self.width, self.pre = height, width, pre
        self.device, self.device_id = f"cuda:{device}", device
        self.library = _library(without_dali=True)
        if self.library == "nvimgcodec":
            nvimgcodec = self.nvimgcodec = _import_nvimgcodec()
            # Every backend, best first: the GPU's hardware JPEG decoder where it has one, then nvJPEG's CUDA and
            # hybrid decoders, then the CPU. No EXIF rotation: the CPU path (Pillow) and torchvision apply none.
            with _native_stderr_to_log("nvImageCodec"):
                self.decoder = nvimgcodec.Decoder(**self._decoder_args(device, self.BACKENDS))
            self._fallback = None  # every backend, made when a restricted set first returns nothing for a file
            self.params = nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB,
                                                  allow_any_depth=False)
        else:
            import torchvision.io as tio

            self.tio = tio
        self.stream = torch.cuda.Stream(device=self.device, priority=self.STREAM_PRIORITY)
        if self.GEOMETRY not in ("matmul", "groups"):
            raise ValueError(f"NvjpegDecoder.GEOMETRY must be 'matmul' or 'groups', not {self.GEOMETRY!r}")
        self._resample = BatchResampler(torch, self.device, height, width, pre) if self.GEOMETRY == "matmul" else None
        self._host = None  # page-locked [rows, H, W, 3] uint8, grown as needed
        self._index = None  # page-locked int64 row indices (_device_index), grown as needed
        #: Seconds per phase over every call (the job's report shows them: where the decoding process's time goes):
        #: reading the files, nvJPEG's decode, the preset's resize and crop, the copy back into ``out``.
        self.phases = {"images": 0, "read_s": 0.0, "decode_s": 0.0, "resize_s": 0.0, "copy_s": 0.0}
        if self.WARM_UP and warm:
            self.warm_up(self.WARM_UP)

    #: Image sizes (height, width) the warm-up JPEGs take in turn: small ones here; DaliDecoder's are photographs'.
    WARM_SIZES = tuple((48 + 8 * (k % 5), 64 + 8 * (k % 7)) for k in range(35))

    def warm_up(self, count: int) -> None:
        """Decode ``count`` baseline JPEGs of WARM_SIZES twice through the whole path (read, decode,
        geometry), then zero the phases. nvImageCodec makes its per-thread nvJPEG decoders (hardware and lossless
        plugins, a shared context under a lock) on the first batches a thread takes, and torchvision its decoder
        and buffers: inside `batch` that was paid by the job's first batches (py-spy --native, issue 22 sixth
        session). Measured on the H200, 10,000 JPEGs at batch 64: steady rate nvImageCodec 3,048 rows/s warmed
        (2 CPU threads) against 2,627 cold, torchvision 4,984 against 3,968; start-up +1.6 / +2.2 s."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="onnxaccel-nvjpeg-") as folder:
            paths = []
            for k in range(count):
                path = Path(folder) / f"{k}.jpg"
                path.write_bytes(_warm_up_jpeg(*self.WARM_SIZES[k % len(self.WARM_SIZES)]))
                paths.append(str(path))
            for _ in range(2):
                self.decode_device(paths)
        self.phases = dict.fromkeys(self.phases, 0)
        self.phases["images"] = 0

    def decode(self, paths: list[str], out: np.ndarray | None = None) -> tuple[np.ndarray, dict[int, str]]:
        """uint8 [len(paths), H, W, 3] (into ``out`` when given) and per bad row its message (a zero row)."""
        torch = self.torch
        if out is None:
            out = np.zeros((len(paths), self.height, self.width, 3), np.uint8)
        pixels, bad = self.decode_device(paths)
        began = time.perf_counter()
        n = pixels.shape[0]
        if self._host is None or self._host.shape[0] < n:
            self._host = torch.empty((n, self.height, self.width, 3), dtype=torch.uint8, pin_memory=True)
        host = self._host[:n]
        with torch.cuda.stream(self.stream):
            host.copy_(pixels, non_blocking=True)
        self.stream.synchronize()
        out[:n] = host.numpy()
        self.phases["copy_s"] += time.perf_counter() - began
        return out, bad

    def decode_device(self, paths: list[str]) -> tuple[object, dict[int, str]]:
        """A torch uint8 tensor [len(paths), H, W, 3] on the GPU, C-contiguous, its work finished (this decoder's
        stream synchronised, so any stream or library may read it), and per bad row its message (a zero row)."""
        torch = self.torch
        bad: dict[int, str] = {}
        jpegs, where, others = [], [], {}
        phases, began = self.phases, time.perf_counter()
        phases["images"] += len(paths)
        for i, path in enumerate(paths):
            if Path(path).suffix.lower() in (".jpg", ".jpeg"):
                jpegs.append(self._read(path))
                where.append(i)
            else:
                try:
                    others[i] = decode_pixels(path, self.height, self.width, self.pre)
                except InputError as exc:
                    bad[i] = exc.message
        read = time.perf_counter()
        phases["read_s"] += read - began
        with torch.cuda.stream(self.stream):
            images = []
            if jpegs and self.library == "nvimgcodec":
                images = self._decode_nvimgcodec(jpegs, where, bad)
                self.stream.synchronize()  # as below: the decode phase is its own
            elif jpegs:
                try:
                    images = self.tio.decode_jpeg(jpegs, mode=self.tio.ImageReadMode.RGB, device=self.device)
                    self.stream.synchronize()  # one wait per batch, so the phases below are each their own
                except RuntimeError:  # one bad file fails the batch: decode one by one to find it
                    images = []
                    for i, data in zip(where, jpegs):
                        try:
                            images.append(self.tio.decode_jpeg(data, mode=self.tio.ImageReadMode.RGB,
                                                               device=self.device))
                        except RuntimeError as exc:
                            images.append(None)
                            bad[i] = f"cannot decode JPEG: {exc}"
            good = [(i, img) for i, img in zip(where, images) if img is not None]
            decoded = time.perf_counter()
            phases["decode_s"] += decoded - read
            geometry = self._resample or self._geometry_all
            shaped = geometry([img for _, img in good]) if good else None  # [n, H, W, 3] on the device
            rows = [i for i, _ in good]
            if shaped is not None and rows == list(range(len(paths))):
                pixels = shaped
            else:  # some rows are not JPEG-decoded: zeros, then each row where it belongs
                pixels = torch.zeros((len(paths), self.height, self.width, 3), dtype=torch.uint8, device=self.device)
                if shaped is not None:
                    pixels[torch.tensor(rows, device=self.device)] = shaped
                for i, row in others.items():
                    pixels[i] = torch.from_numpy(row).to(self.device)
            self.stream.synchronize()
        phases["resize_s"] += time.perf_counter() - decoded
        return pixels, bad

    def _read(self, path: str):
        """A JPEG file as its library takes it: nvImageCodec's CodeStream (it reads the file), torchvision's bytes
        tensor."""
        if self.library == "nvimgcodec":
            return self.nvimgcodec.CodeStream(str(path))
        return self.tio.read_file(str(path))

    def _decoder_args(self, device: int, backends: tuple[str, ...]) -> dict:
        """nvimgcodec.Decoder's keyword arguments for ``backends`` (NVJPEG_BACKENDS names; empty: all)."""
        kinds = self.nvimgcodec.BackendKind
        args: dict = {"device_id": device}
        if backends:
            args["backends"] = [self.nvimgcodec.Backend(getattr(kinds, NVJPEG_BACKENDS[b])) for b in backends]
        if self.CPU_THREADS:
            args["max_num_cpu_threads"] = self.CPU_THREADS
        if self.OPTIONS:
            args["options"] = self.OPTIONS
        return args

    def _decode_nvimgcodec(self, streams: list, where: list[int], bad: dict[int, str]) -> list:
        """Decode a batch with nvImageCodec on this decoder's stream: per file a [3, h, w] uint8 tensor on the
        device (the decoded image's memory, held through the tensor), or None with its row in ``bad``. Files a
        restricted backend set returns nothing for (the hardware decoder takes baseline JPEG only) are decoded
        again with every backend."""
        torch = self.torch
        decoded = list(self.decoder.decode(streams, params=self.params, cuda_stream=self.stream.cuda_stream))
        missed = [k for k, image in enumerate(decoded) if image is None]
        if missed and self.BACKENDS:
            if self._fallback is None:
                with _native_stderr_to_log("nvImageCodec"):
                    self._fallback = self.nvimgcodec.Decoder(**self._decoder_args(self.device_id, ()))
            again = self._fallback.decode([streams[k] for k in missed], params=self.params,
                                          cuda_stream=self.stream.cuda_stream)
            for k, image in zip(missed, again):
                decoded[k] = image
        images = []
        for i, image in zip(where, decoded):
            # HWC on the device (strided: pitched rows are allowed); torch keeps the Image alive with the tensor.
            # The shape is read from the tensor: each of the Image's own accessors gives up the GIL and waits to
            # take it back behind the job's other threads.
            pixels = None if image is None else torch.as_tensor(image, device=self.device)
            if pixels is None or pixels.ndim != 3 or pixels.shape[2] != 3:
                images.append(None)
                bad[i] = "cannot decode JPEG (nvImageCodec could not decode the file)"
                continue
            images.append(pixels.permute(2, 0, 1))
        return images

    def _geometry_all(self, images: list):
        """[3, h, w] uint8 images on the GPU -> [n, H, W, 3] uint8, images of one size resized as one batch."""
        torch = self.torch
        groups: dict[tuple[int, int], list[int]] = {}
        for k, img in enumerate(images):
            groups.setdefault(tuple(img.shape[1:]), []).append(k)
        parts = [self._geometry(torch.stack([images[k] for k in ks]) if len(ks) > 1 else images[ks[0]][None])
                 for ks in groups.values()]
        out = torch.cat(parts) if len(parts) > 1 else parts[0]  # in group order
        order = [k for ks in groups.values() for k in ks]
        if order != list(range(len(order))):  # back into the images' order: one gather, its index copied async
            where = [0] * len(order)
            for position, k in enumerate(order):
                where[k] = position
            out = out.index_select(0, self._device_index(where))
        return out.permute(0, 2, 3, 1).contiguous()

    def _device_index(self, values: list[int]):
        """``values`` as an int64 tensor on the device, copied from a page-locked buffer without a wait (a plain
        ``torch.tensor(..., device=)`` copies from pageable memory and waits for the stream: once per size group
        it held the resize of every earlier group). Safe to rewrite at the next call: each call ends with the
        stream synchronised."""
        torch = self.torch
        if self._index is None or self._index.shape[0] < len(values):
            self._index = torch.empty(max(256, len(values)), dtype=torch.int64, pin_memory=True)
        host = self._index[:len(values)]
        host.copy_(torch.as_tensor(values, dtype=torch.int64))
        return host.to(self.device, non_blocking=True)

    def _geometry(self, img):
        """[n, 3, h, w] uint8 on the GPU -> [n, 3, H, W] by the preset (bilinear, as Pillow's BILINEAR on
        downscale within a level or two; antialias on)."""
        torch = self.torch
        import torch.nn.functional as F

        n, _, h0, w0 = img.shape
        height, width, pre = self.height, self.width, self.pre
        x = img.float()
        if pre.preset == "imagenet":
            short = pre.resize or round(min(height, width) * 256 / 224)
            scale = short / min(h0, w0)
            nh, nw = max(height, round(h0 * scale)), max(width, round(w0 * scale))
            x = F.interpolate(x, size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)
            top, left = (nh - height) // 2, (nw - width) // 2
            x = x[..., top:top + height, left:left + width]
        elif pre.preset == "yolo":
            r = min(height / h0, width / w0)
            nh, nw = max(1, round(h0 * r)), max(1, round(w0 * r))
            x = F.interpolate(x, size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)
            canvas = torch.full((n, 3, height, width), float(pre.pad_value), device=x.device)
            top, left = (height - nh) // 2, (width - nw) // 2
            canvas[..., top:top + nh, left:left + nw] = x
            x = canvas
        elif (h0, w0) != (height, width):
            x = F.interpolate(x, size=(height, width), mode="bilinear", antialias=True, align_corners=False)
        return x.round().clamp(0, 255).to(torch.uint8)
