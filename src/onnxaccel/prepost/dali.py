"""nvJPEG through NVIDIA DALI: the whole image path of a `batch` unit (file read, JPEG decode on the GPU's hardware
decoder first, the preset's geometry) as one DALI pipeline that runs in DALI's own C++ threads.

Why: in the job's process, a decoder driven from Python spends much of its time taking the GIL back after each
native call (py-spy --native showed the decoding threads waiting in pthread_cond_timedwait under nvImageCodec's
CodeStream, pybind11's gil_scoped_acquire and torch's operations). Here a batch is one ``feed_input`` of the file
names and one ``run``: DALI reads the files, decodes and resizes without the GIL, and inside `batch` it is the
fastest of the GPU decoders. With FANCY_UPSAMPLING its pixels are as close to Pillow's as nvImageCodec's
(benchmarks/decode_pixels.py), so `auto` picks it where installed (prepost/decode.py _library). Each unit is fed
and run on its own, one unit in flight per pipeline: feeding units ahead (``schedule_run``) was slower inside the
job and gained nothing alone, and was taken out. The pipeline is built and warmed at the job's batch size: DALI
builds a pipeline per batch size, and one rebuilt inside the job cost more than half the rate. Rates and pixel
differences: docs/BENCHMARKS.md ("Batch", "Decode") and its history.

Geometry: the imagenet preset's resize + center crop is one ``fn.resize`` with a region of interest: output pixel
i of the crop samples the input at center (top + i + 0.5) * h0 / nh, the same sampling and antialiasing scale as
resizing to nh x nw and cropping, so the pixels are those of prepost/resample.py within rounding (held by
tests/prepost/test_dali.py on photographs, DALI on the CPU); an image already at the model's size keeps it
(nh x nw is its own size: no resize, no crop). yolo: resized to the letterbox's size, then
``fn.slice`` with the fill outside the image; none/scale01: resized to the input size. Sizes rounded as
inputs_files.apply_geometry (Python's round: halves to even), read from the headers without EXIF rotation.

DALI's API as used here: nvidia-dali-cuda130 2.4.0 (``fn.io.file.read``, ``fn.decoders.image`` device "mixed",
``fn.peek_image_shape``, ``fn.resize`` roi_start/roi_end, ``fn.slice`` out_of_bounds_policy, ``Pipeline
.feed_input``, ``TensorListGPU.copy_to_external``). EXIF orientation is not applied (adjust_orientation=False), as
on the CPU path. Never run on AMD hardware (DALI is NVIDIA's; rocAL is not wired).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import time
from pathlib import Path

import numpy as np

from onnxaccel.errors import InputError
from onnxaccel.inputs_files import ImagePreprocess


def dali_missing() -> str:
    """'' when DALI (PyPI nvidia-dali-cuda130 / -cuda120) is installed here, else why not (found, not imported)."""
    try:
        found = importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        found = False
    return "" if found else "DALI is not installed (nvidia.dali)"


def _round(dmath, x):
    """Python's round() (halves to even) on a DALI float node: 2.5 -> 2, 3.5 -> 4, as the CPU path sizes images."""
    r = dmath.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * dmath.floor(r * 0.5)) == 1.0
    return r - tie * odd


def geometry(fn, types, dmath, encoded, images, height: int, width: int, pre: ImagePreprocess):
    """The preset's geometry as DALI operators on decoded ``images`` (HWC uint8), their sizes read from the
    ``encoded`` files' headers as stored (no EXIF rotation, as the decoder): uint8 [height, width, 3] per sample."""
    shape = fn.cast(fn.peek_image_shape(encoded, adjust_orientation=False), dtype=types.FLOAT)
    h0, w0 = shape[0], shape[1]
    resize = dict(antialias=True, interp_type=types.INTERP_LINEAR, dtype=types.UINT8)
    if pre.preset == "imagenet":
        short = pre.resize or round(min(height, width) * 256 / 224)
        scale = short / dmath.min(h0, w0)
        # An image already at the model's size is fed as it is (resample.geometry_plan): its resized size is its own.
        exact = fn.cast(h0 == float(height), dtype=types.FLOAT) * fn.cast(w0 == float(width), dtype=types.FLOAT)
        nh = exact * height + (1.0 - exact) * dmath.max(float(height), _round(dmath, h0 * scale))
        nw = exact * width + (1.0 - exact) * dmath.max(float(width), _round(dmath, w0 * scale))
        top, left = dmath.floor((nh - height) * 0.5), dmath.floor((nw - width) * 0.5)
        sy, sx = h0 / nh, w0 / nw
        return fn.resize(images, size=[float(height), float(width)], roi_start=fn.stack(top * sy, left * sx),
                         roi_end=fn.stack((top + height) * sy, (left + width) * sx), roi_relative=False, **resize)
    if pre.preset == "yolo":
        r = dmath.min(height / h0, width / w0)
        nh, nw = dmath.max(1.0, _round(dmath, h0 * r)), dmath.max(1.0, _round(dmath, w0 * r))
        boxed = fn.resize(images, size=fn.stack(nh, nw), **resize)
        top, left = dmath.floor((height - nh) * 0.5), dmath.floor((width - nw) * 0.5)
        start = fn.cast(fn.stack(-top, -left), dtype=types.INT32)
        return fn.slice(boxed, start=start, shape=[height, width], axes=[0, 1], out_of_bounds_policy="pad",
                        fill_values=float(pre.pad_value))
    return fn.resize(images, size=[float(height), float(width)], **resize)


class DaliDecoder:
    """The GPU decoder interface of prepost/nvjpeg.py's NvjpegDecoder (``decode_device(paths)``, ``decode(paths,
    out)``, ``phases``) through a DALI pipeline on ``device``: JPEG files (by name: DALI reads them) decoded with
    ``fn.decoders.image`` device "mixed" (the hardware decoder first, nvImageCodec's choice), the geometry on the
    GPU, copied into this decoder's own device buffer (DALI reuses its outputs at the next run). Other formats and
    batches DALI refuses (one bad file fails a DALI batch) go through an NvjpegDecoder made when first needed,
    which finds the bad rows file by file."""

    name = "nvjpeg"
    library = "dali"
    #: DALI's CPU threads (file reads, headers, the hardware decoder's host side) per pipeline.
    CPU_THREADS = 4
    #: Share of a batch DALI gives the hardware JPEG decoder (fn.decoders.image hw_decoder_load; DALI's default
    #: 0.65, nvImageCodec's 0.9). The rest goes to nvJPEG's CUDA decoder, whose Huffman decoding is on the CPU.
    #: 1.0 was faster than 0.9 inside `batch` (docs/BENCHMARKS.md, "Decode").
    HW_DECODER_LOAD = 1.0
    #: fn.decoders.image jpeg_fancy_upsampling: chroma upsampled by interpolation, as libjpeg-turbo (Pillow) does,
    #: instead of replicated; DALI passes it to nvImageCodec's CUDA and hardware decoders (NVIDIA/DALI
    #: dali/operators/imgcodec/image_decoder.h, "fancy_upsampling" for nvjpeg_cuda_decoder and nvjpeg_hw_decoder).
    #: Without it the pixels are as far from Pillow's as torchvision's decode_jpeg; with it as close as
    #: nvImageCodec's, at no cost in rate (benchmarks/decode_pixels.py; figures in docs/BENCHMARKS.md, "Decode").
    FANCY_UPSAMPLING = True
    #: Warm-up JPEGs at photographs' sizes (ImageNet's are ~500x375, its larger ones 640x480): the hardware
    #: decoder's and nvJPEG's buffers grow to them in the warm-up, not in the job's first batches.
    WARM_SIZES = ((375, 500), (480, 640), (333, 500), (500, 375), (427, 640), (640, 480))

    def __init__(self, height: int, width: int, pre: ImagePreprocess, device: int = 0, batch: int = 64):
        import torch

        importlib.import_module("nvidia.dali")  # an ImportError here says why DALI cannot run

        self.torch = torch
        self.height, self.width, self.pre, self.device_id = height, width, pre, device
        self.device = f"cuda:{device}"
        self.stream = torch.cuda.Stream(device=self.device)
        self.pipe = None
        self.batch = 0
        #: The pipeline's batch size (DALI builds a pipeline for one): the job's, so the warm-up builds the
        #: pipeline the job runs. Warmed at 64 and run at 256, each pipeline was rebuilt inside the job and the
        #: batch-256 rate fell to under half the batch-64 one (docs/BENCHMARKS.md, history of "Batch").
        self.min_batch = max(64, batch)
        self._fallback = None
        self.fallback_images = 0  # images the fallback decoder took (the job's report says how many)
        self.phases = {"images": 0, "read_s": 0.0, "decode_s": 0.0, "resize_s": 0.0, "copy_s": 0.0}
        from onnxaccel.prepost.nvjpeg import NvjpegDecoder

        if NvjpegDecoder.WARM_UP:
            self.warm_up(max(NvjpegDecoder.WARM_UP, self.min_batch))

    def warm_up(self, count: int) -> None:
        """Build the pipeline and run it on ``count`` JPEGs of WARM_SIZES (prepost/nvjpeg.py NvjpegDecoder.warm_up)."""
        from onnxaccel.prepost.nvjpeg import NvjpegDecoder

        NvjpegDecoder.warm_up(self, count)

    def _build(self, batch: int):
        from nvidia.dali import fn, math as dmath, pipeline_def, types

        height, width, pre = self.height, self.width, self.pre

        @pipeline_def(batch_size=batch, num_threads=self.CPU_THREADS, device_id=self.device_id,
                      prefetch_queue_depth=1)
        def images():
            names = fn.external_source(name="paths", dtype=types.UINT8, ndim=1)
            encoded = fn.io.file.read(names)
            decoded = fn.decoders.image(encoded, device="mixed", output_type=types.RGB, adjust_orientation=False,
                                        hw_decoder_load=self.HW_DECODER_LOAD,
                                        jpeg_fancy_upsampling=self.FANCY_UPSAMPLING)
            return geometry(fn, types, dmath, encoded, decoded, height, width, pre)

        pipe = images()
        pipe.build()
        self.pipe, self.batch = pipe, batch

    def decode_device(self, paths: list[str]) -> tuple[object, dict[int, str]]:
        """A torch uint8 tensor [len(paths), H, W, 3] on the GPU, its work finished, and per bad row its message.
        A pipeline DALI cannot build raises (the decoder cannot run here: the job says so at start-up, when the
        warm-up builds it); a batch DALI fails goes through the fallback decoder, and the pipeline is rebuilt at the
        next batch (DALI invalidates a pipeline that raised)."""
        torch = self.torch
        if any(Path(p).suffix.lower() not in (".jpg", ".jpeg") for p in paths):
            return self._via_fallback(paths)
        if self.pipe is None or len(paths) > self.batch:
            self._build(max(len(paths), self.min_batch))
        began = time.perf_counter()
        try:
            self.pipe.feed_input("paths", [np.frombuffer(str(p).encode(), np.uint8) for p in paths])
            (out,) = self.pipe.run()
        except Exception:  # a file DALI cannot read or decode fails its batch: find it file by file
            self.pipe = None
            return self._via_fallback(paths)
        ran = time.perf_counter()
        self.phases["images"] += len(paths)
        self.phases["decode_s"] += ran - began  # read, decode and geometry: one DALI run
        pixels = torch.empty((len(paths), self.height, self.width, 3), dtype=torch.uint8, device=self.device)
        out.copy_to_external(ctypes.c_void_p(pixels.data_ptr()), cuda_stream=ctypes.c_void_p(self.stream.cuda_stream),
                             non_blocking=True)
        self.stream.synchronize()
        self.phases["copy_s"] += time.perf_counter() - ran
        return pixels, {}

    def _via_fallback(self, paths: list[str]) -> tuple[object, dict[int, str]]:
        """``paths`` through the fallback NvjpegDecoder, its phases added to this decoder's (the job's report)."""
        fallback = self._fallback_decoder()
        before = dict(fallback.phases)
        result = fallback.decode_device(paths)
        for key, value in fallback.phases.items():
            self.phases[key] = self.phases.get(key, 0) + value - before.get(key, 0)
        self.fallback_images += fallback.phases.get("images", 0) - before.get("images", 0)
        return result

    def decode(self, paths: list[str], out: np.ndarray | None = None) -> tuple[np.ndarray, dict[int, str]]:
        """uint8 [len(paths), H, W, 3] on the host (into ``out`` when given) and per bad row its message."""
        pixels, bad = self.decode_device(paths)
        host = pixels.cpu().numpy()
        if out is None:
            return host, bad
        out[:len(paths)] = host
        return out, bad

    def _fallback_decoder(self):
        if self._fallback is None:
            from onnxaccel.prepost.nvjpeg import NvjpegDecoder

            try:  # No warm-up: made mid-job, in a decoding thread, for a batch that is waiting.
                self._fallback = NvjpegDecoder(self.height, self.width, self.pre, self.device_id, warm=False)
            except ImportError:  # neither nvImageCodec nor torchvision here (--decoder dali): the CPU decode
                self._fallback = CpuFallback(self.height, self.width, self.pre, self.device)
        return self._fallback


class CpuFallback:
    """DaliDecoder's fallback where no GPU library is: each file decoded on the CPU (prepost/cpu_decode.py
    decode_files_into, Pillow), a file that cannot be decoded a zero row with its message; the batch copied to
    ``device``. The NvjpegDecoder interface DaliDecoder uses: ``decode_device``, ``phases``, ``library``."""

    library = "cpu"

    def __init__(self, height: int, width: int, pre: ImagePreprocess, device: str):
        self.height, self.width, self.pre, self.device = height, width, pre, device
        self.phases = {"images": 0, "read_s": 0.0, "decode_s": 0.0, "resize_s": 0.0, "copy_s": 0.0}

    def decode_device(self, paths: list[str]) -> tuple[object, dict[int, str]]:
        """A torch uint8 tensor [len(paths), H, W, 3] on the device and per bad row its message (a zero row)."""
        import torch

        from onnxaccel.prepost.cpu_decode import decode_files_into

        began = time.perf_counter()
        pixels = np.empty((len(paths), self.height, self.width, 3), np.uint8)
        bad = decode_files_into(paths, pixels, self.height, self.width, self.pre)
        decoded = time.perf_counter()
        out = torch.from_numpy(pixels).to(self.device)
        self.phases["images"] += len(paths)
        self.phases["decode_s"] += decoded - began
        self.phases["copy_s"] += time.perf_counter() - decoded
        return out, bad


def cpu_pipeline_images(paths: list[str], height: int, width: int,
                        pre: ImagePreprocess) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The same read, decode and geometry on DALI's CPU backend (tests here have no GPU): per file the uint8 HWC
    pixels at the geometry, and the decoded image before it."""
    from nvidia.dali import fn, math as dmath, pipeline_def, types

    @pipeline_def(batch_size=len(paths), num_threads=1, device_id=None)
    def images():
        names = fn.external_source(name="paths", dtype=types.UINT8, ndim=1)
        encoded = fn.io.file.read(names)
        decoded = fn.decoders.image(encoded, device="cpu", output_type=types.RGB, adjust_orientation=False)
        return geometry(fn, types, dmath, encoded, decoded, height, width, pre), decoded

    pipe = images()
    pipe.build()
    pipe.feed_input("paths", [np.frombuffer(str(p).encode(), np.uint8) for p in paths])
    try:
        out, decoded = pipe.run()
    except RuntimeError as exc:
        raise InputError(f"DALI could not decode {len(paths)} files: {exc}", "Check the files.") from exc
    return [np.asarray(out.at(k)) for k in range(len(paths))], [np.asarray(decoded.at(k)) for k in range(len(paths))]
