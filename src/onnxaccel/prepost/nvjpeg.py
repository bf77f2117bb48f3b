"""nvJPEG on an NVIDIA GPU (prepost/decode.py ``nvjpeg``): :class:`NvjpegDecoder`, batched JPEG decode through
nvImageCodec or torchvision, then the preset's geometry with torch on the GPU. Which library it goes through is
resolved by prepost/decode.py (``_library``; DALI's decoder is prepost/dali.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from onnxaccel.errors import InputError
from onnxaccel.inputs_files import ImagePreprocess, pillow
from onnxaccel.prepost.cpu_decode import decode_pixels
from onnxaccel.prepost.resample import BatchResampler

logger = logging.getLogger(__name__)

#: The environment variable naming the library nvJPEG is called through (NvjpegDecoder.LIBRARY; its values:
#: prepost/decode.py LIBRARIES).
LIBRARY_ENV = "ONNXACCEL_NVJPEG_LIBRARY"
#: nvImageCodec's backend kinds by the names NvjpegDecoder.BACKENDS uses: the GPU's hardware JPEG engine (A100
#: and Hopper GPUs: baseline JPEG only), nvJPEG's CUDA decoder, its hybrid CPU/GPU decoder, the CPU (libjpeg-turbo).
NVJPEG_BACKENDS = {"hw": "HW_GPU_ONLY", "gpu": "GPU_ONLY", "hybrid": "HYBRID_CPU_GPU", "cpu": "CPU_ONLY"}


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


@functools.lru_cache(maxsize=64)
def _warm_up_jpeg(height: int, width: int) -> bytes:
    """A baseline JPEG of a colour gradient, ``height`` x ``width`` (made once per size: every decoding thread's
    warm-up takes the same files, up to a batch of 256 photograph-sized ones for DALI)."""
    import io

    pixels = np.add.outer(np.arange(height), np.arange(width))[:, :, None] * np.array([1, 2, 3]) % 256
    buffer = io.BytesIO()
    pillow().fromarray(pixels.astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


class NvjpegDecoder:
    """Batched JPEG decode on an NVIDIA GPU (nvJPEG), then the preset's geometry with torch on the GPU, copied back
    as uint8 NHWC. Non-JPEG files fall back to :func:`decode_pixels`. nvJPEG through nvImageCodec where installed
    (``Decoder(device_id).decode(code_streams, params=, cuda_stream=)``: every backend allowed, the hardware
    decoder first; images with ``__cuda_array_interface__``, None where a file cannot be decoded), else through
    torchvision's documented API (decode_jpeg accepts a list of uint8 tensors and a device).

    Resizing and copying back image by image (a device sync per image) was slow (see docs/BENCHMARKS.md); so images
    of one size are resized together, the batch is stacked on the device and copied back once, through a
    page-locked buffer, on a stream of its own (the model's runs keep theirs)."""

    name = "nvjpeg"
    #: The decoding stream's priority (torch: 0 the default, -1 high): above the model's streams, its kernels are
    #: scheduled first when both wait for the GPU.
    STREAM_PRIORITY = 0

    #: Which library calls nvJPEG: "auto" (_library: DALI, else nvImageCodec, else torchvision), "dali"
    #: (gpu_decoder makes prepost/dali.py's DaliDecoder; this class then serves its other files and failed
    #: batches), "nvimgcodec" or "torchvision"; the environment's ONNXACCEL_NVJPEG_LIBRARY or --decoder
    #: dali|nvimgcodec|torchvision sets it. nvImageCodec's pixels are closest to Pillow's; torchvision's are further
    #: off (the hardware decoder's chroma upsampling, without interpolation); DALI is the fastest inside `batch`
    #: (see docs/BENCHMARKS.md).
    LIBRARY = os.environ.get(LIBRARY_ENV, "auto")
    #: nvImageCodec's backends, in order (names of NVJPEG_BACKENDS; empty: every backend, the library's choice);
    #: the CPU threads of each decoder's executor (0: the library's default, one per core) and its options string
    #: (nvImageCodec's "Decoder options format", e.g. ``nvjpeg_hw_decoder:preallocate_batch_size=64``). A file a
    #: restricted set cannot decode is decoded again with every backend before it counts as bad.
    #: CPU_THREADS is 2: nvImageCodec makes an nvJPEG decoder per executor thread (one per core by default), one
    #: after another under a lock, so with one per core a decoder takes far longer to start (see
    #: docs/BENCHMARKS.md).
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

        from onnxaccel.prepost.decode import _library  # decode.py imports this class (its LIBRARY setting)

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
        and buffers: inside `batch` that was paid by the job's first batches. Warmed, both run faster at a
        steady rate for a little more start-up (see docs/BENCHMARKS.md)."""
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
        if (h0, w0) == (height, width) and pre.preset != "yolo":  # already the model's size (apply_geometry)
            pass
        elif pre.preset == "imagenet":
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
