"""Which image decoder `batch` uses: uint8 HWC pixels at the preset's geometry, decoded at reduced size.

Decoders, chosen by :func:`choose_decoder` (the CPU decode itself is prepost/cpu_decode.py, the pool
prepost/decode_pool.py, nvJPEG prepost/nvjpeg.py and prepost/dali.py; this module resolves which library nvJPEG
goes through and makes the GPU decoder, :func:`gpu_decoder`):

- ``nvjpeg``: NVIDIA nvJPEG, batched on the GPU, through NVIDIA DALI (prepost/dali.py: read, decode and geometry
  in DALI's threads), nvImageCodec (``nvidia.nvimgcodec``: the GPU's hardware JPEG decoder where it has one) or
  torchvision.io.decode_jpeg(device="cuda"), the first installed (``--decoder dali|nvimgcodec|torchvision`` names
  one); the geometry with torch on the GPU (DALI: its own); in the job's own process (scale/pipeline.py) or in
  one of its own (DecodePool ``gpu``). Used automatically on CUDA targets where torch with CUDA and a library
  import; never required. Checked on GPUs (docs/BENCHMARKS.md); without a GPU, DALI's and nvImageCodec's CPU
  backends run in tests.
- ``hybrid``: nvJPEG and the CPU pool together, each batch split by their rates (no faster than ``nvjpeg``
  alone: not chosen automatically; see docs/BENCHMARKS.md).
- ``cpu-pool``: worker processes (os.cpu_count()) decoding straight into a shared-memory batch buffer: only
  file names and slot indices travel between processes, never pixels.
- ``cpu``: the same decode in the calling thread (one core, or a pool that could not start).

AMD (rocJPEG/rocAL) is not wired: no AMD GPU exists here to check it on.
"""

from __future__ import annotations

import contextlib
import logging
import os

from onnxaccel.errors import InputError
from onnxaccel.inputs_files import ImagePreprocess
from onnxaccel.prepost.dali import dali_missing
from onnxaccel.prepost.decode_pool import pool_size
from onnxaccel.prepost.nvjpeg import LIBRARY_ENV, NvjpegDecoder

logger = logging.getLogger(__name__)

#: The values of LIBRARY_ENV (prepost/nvjpeg.py): auto, or the library nvJPEG is called through.
LIBRARIES = ("auto", "dali", "nvimgcodec", "torchvision")
#: --decoder's values: a library's name is nvjpeg through that library.
DECODERS = ("auto", "hybrid", "nvjpeg", *LIBRARIES[1:], "cpu-pool", "cpu")
#: The libraries as reports name them.
LIBRARY_NAMES = {"dali": "DALI", "nvimgcodec": "nvImageCodec", "torchvision": "torchvision",
                 "cpu": "the CPU (Pillow)"}
#: The decoders that need nvJPEG (torch with CUDA, and DALI, nvImageCodec or torchvision).
GPU_DECODERS = ("nvjpeg", "hybrid")


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


def nvjpeg_library() -> str:
    """The library nvJPEG is called through here: "DALI", "nvImageCodec" or "torchvision"."""
    library = _library()
    return LIBRARY_NAMES.get(library, library)


def _library(without_dali: bool = False) -> str:
    """ONNXACCEL_NVJPEG_LIBRARY resolved: "dali", "nvimgcodec" or "torchvision". auto: DALI where installed beside
    nvImageCodec or torchvision (DALI's batches that fail, and files that are not JPEG, go through one of them), else
    nvImageCodec, else torchvision. ``without_dali``: the library DaliDecoder's fallback uses.

    Why DALI first: the fastest of the three inside `batch`, with pixels as close to Pillow's as nvImageCodec's
    (DaliDecoder.FANCY_UPSAMPLING); see docs/BENCHMARKS.md."""
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
#: process-wide lock, its reads and geometry run beside it): the count that ran fastest for each, see
#: docs/BENCHMARKS.md.
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


def nvimgcodec_missing() -> str:
    """'' when nvImageCodec (NVIDIA's codec library, PyPI nvidia-nvimgcodec-cu12/-cu13) is installed here, else
    why not. Found, not imported: its import prints to the process's stderr (prepost/nvjpeg.py
    _import_nvimgcodec), and this check may run in a thread beside others; the decoder imports it when it is
    made."""
    import importlib.util

    try:
        found = importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except (ImportError, ValueError):
        found = False
    return "" if found else "nvImageCodec is not installed (nvidia.nvimgcodec)"
