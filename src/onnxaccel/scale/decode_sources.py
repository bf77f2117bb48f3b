"""How a pipelined `batch` run (scale/pipeline.py) decodes images for a uint8 NHWC model: the decoder chosen and
its processes started (:func:`_decode_plan`), the source made from that plan (:func:`_source`), and the sources
that decode with nvJPEG, in a process of its own or in the job's own process and CUDA context.
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from onnxaccel.engines.pool import CAPTURE_GATE
from onnxaccel.pipeline import BoundModel, ModelFromSource
from onnxaccel.prepost.decode import LIBRARY_NAMES, choose_decoder, dali_failed, gpu_decode_threads
from onnxaccel.prepost.decode_pool import GPU_DECODER, DecodePool, pool_size
from onnxaccel.scale.datasets import Unit
from onnxaccel.scale.host_sources import (_bad_rows, _direct_copies, _PinnedSlots, _PoolSource, _ReaderSource,
                                          _unit_files)
from onnxaccel.scale.stages import DEPTH, StageTimes
from onnxaccel.scale.worker import BatchWorker, WorkerSpec, source_of

#: Threads reading .npy/.npz units at once (one thread reading uint8 images through np.load's memory map was
#: nearly always busy at large batches: see docs/BENCHMARKS.md).
READ_THREADS = 3
#: The GPU decoding process's decoder (``module:Class``; a test names a CPU one).
GPU_DECODER_CLASS = GPU_DECODER
#: The ``nvjpeg`` and ``hybrid`` decoders' nvJPEG in the job's own process and CUDA context (decoded batches handed
#: to the model on the device), where the runs take direct copies; else in a process of its own (DecodePool
#: ``gpu``). Faster than a process of its own, with outputs identical to the process decoder's: see
#: docs/BENCHMARKS.md.
NVJPEG_IN_PROCESS = True
#: Threads decoding with nvJPEG in the job's process, each with its own decoder and CUDA stream; None: the
#: library's own count (prepost/decode.py DECODE_THREADS: nvImageCodec 2, torchvision and DALI 3).
GPU_DECODE_THREADS: int | None = None


def _gpu_decode_threads() -> int:
    """The decoding threads of nvJPEG in the job's process: GPU_DECODE_THREADS, else the library's own count."""
    return GPU_DECODE_THREADS or gpu_decode_threads()


@dataclass
class _DecodePlan:
    """The decoder chosen for a uint8 image model, its pool (processes starting) and their start-up futures; or,
    for nvJPEG in this process (``inline``: height, width, preset, device), no pool yet."""

    name: str
    pool: DecodePool | None
    starting: list
    inline: tuple | None = None


def _decode_plan(spec: WorkerSpec, decoder: str, times: StageTimes, depth: int = DEPTH) -> _DecodePlan | None:
    """For images fed to a uint8 NHWC model: choose the decoder and start its processes (not waiting for them);
    None for every other input (the worker's own reader: arrays, parquet, float image models)."""
    if spec.dataset.kind != "images" or spec.shape_buckets:
        if spec.dataset.kind == "arrays":
            # .npy/.npz rows are read by several threads at once (file reads release the GIL); parquet handles
            # are not shared between threads.
            times.read_workers = READ_THREADS
        return None
    model = BoundModel(ModelFromSource(source_of(spec.model)), dict(spec.shapes) or None, batch=spec.batch)()
    model_input = model.inputs[0]
    shape = model.input_shapes.get(model_input.name)
    if not (np.dtype(model_input.dtype) == np.uint8 and shape is not None and len(shape) == 4 and shape[3] == 3):
        # Full-size decode and float preprocessing on the host (the exact `run` path), by several threads at once
        # (Pillow's decoders and resampling, and numpy's arithmetic, release the GIL).
        times.decoder, times.decoder_reason = "host-float", (f"the model takes float tensors: host preprocessing, "
                                                             f"{READ_THREADS} threads")
        times.decode_workers = READ_THREADS
        return None
    target = spec.target
    name, why = choose_decoder(target.device, decoder, guard=CAPTURE_GATE.shared)
    times.decoder, times.decoder_reason = name, why
    height, width = int(shape[1]), int(shape[2])
    pre = spec.dataset.preprocess
    device = 0 if spec.drop_device_id else target.device_id or 0
    if name in ("nvjpeg", "hybrid") and NVJPEG_IN_PROCESS:  # nvJPEG made in _source, once the sessions are up
        workers = max(1, pool_size() - 1) if name == "hybrid" else 0  # hybrid: the CPU pool starts now
        times.decode_workers = _gpu_decode_threads() + workers
        pool = DecodePool(depth + 2, spec.batch, height, width, pre, workers=workers) if workers else None
        return _DecodePlan(name, pool, pool.start() if pool else [], inline=(height, width, pre, device))
    if name in ("nvjpeg", "hybrid"):  # nvJPEG in a process of its own; hybrid adds the CPU pool beside it
        workers = max(1, pool_size() - 1) if name == "hybrid" else 0
        times.decode_workers = workers + 1
        pool = DecodePool(depth + 2, spec.batch, height, width, pre, workers=workers, gpu=device,
                          gpu_decoder=GPU_DECODER_CLASS)
    else:
        workers = pool_size() if name == "cpu-pool" else 0
        times.decode_workers = max(1, workers)
        pool = DecodePool(depth + 2, spec.batch, height, width, pre, workers=workers)
    return _DecodePlan(name, pool, pool.start())


def _decoded_through(times: StageTimes, decoders: list) -> None:
    """Where the GPU decoders made are not the library the choice named (DALI that `auto` chose could not
    start), ``decoder_reason`` says which library decodes and why, so the report names what ran."""
    library = getattr(decoders[0], "library", None) if decoders else None
    name = LIBRARY_NAMES.get(library, library)
    if name and f"through {name}" not in times.decoder_reason:
        why = f"DALI could not start: {dali_failed()}" if dali_failed() else "the library chosen could not start"
        times.decoder_reason += f"; decoded through {name} ({why})"


def _source(worker: BatchWorker, spec: WorkerSpec, plan: _DecodePlan | None, depth: int = DEPTH,
            times: StageTimes | None = None):
    """How rows are read: decoded images into shared memory (``plan``: its processes are waited for here), else
    the worker's own reader (into page-locked slots where the GPU takes direct copies)."""
    times = times if times is not None else StageTimes()
    if plan is None:
        slots, times.host_copies = _PinnedSlots.make(worker, depth)
        return _ReaderSource(worker, READ_THREADS if spec.dataset.kind in ("arrays", "images") else 1, slots)
    if plan.inline is not None:
        why = _direct_copies(worker, every=True)
        if not why and plan.pool is None:
            times.host_copies = ("direct: decoded on the GPU in this process, copied device to device into the "
                                 "bound inputs")
            source = _DeviceDecodeSource(worker, plan.inline)
            _decoded_through(times, source.decoders)
            return source
        if not why:  # hybrid: the CPU pool's rows from page-locked shared memory, nvJPEG's on the device
            for future in plan.starting:
                future.result()
            source = _DeviceHybridSource(worker, plan.pool, plan.inline)
            _decoded_through(times, source.device.decoders)
            host = source.pin()
            times.host_copies = (f"{host}; nvJPEG's rows decoded on the GPU in this process, copied device to "
                                 "device" if host.startswith("direct") else host)
            return source
        # The runs cannot take device rows: nvJPEG in a process of its own after all, into shared memory.
        height, width, pre, device = plan.inline
        if plan.pool is not None:
            plan.pool.close()  # hybrid's CPU pool: a new one with the GPU process beside it
        workers = max(1, pool_size() - 1) if plan.name == "hybrid" else 0
        times.decode_workers = workers + 1
        times.notes.append(f"nvJPEG decodes in a process of its own: the runs copy rows on the host ({why})")
        pool = DecodePool(depth + 2, worker.spec.batch, height, width, pre, workers=workers, gpu=device,
                          gpu_decoder=GPU_DECODER_CLASS)
        try:
            plan = _DecodePlan(plan.name, pool, pool.start())
        except BaseException:
            pool.close()
            raise
    try:
        for future in plan.starting:
            future.result()  # a decoder that cannot start (no CUDA, a broken torchvision) stops the job here
        if plan.name in ("nvjpeg", "hybrid"):
            source = _HybridSource(worker, plan.pool, split=plan.name == "hybrid")
        else:
            source = _PoolSource(worker, plan.pool)
        times.host_copies = source.pin()
    except BaseException:
        plan.pool.close()  # the caller closes the pool it started; this one may be the fallback made here
        raise
    return source


class _HybridSource(_PoolSource):
    """Images decoded by nvJPEG in a process of its own (DecodePool ``gpu``), alone (``split`` False: the
    ``nvjpeg`` decoder) or together with the CPU decode pool (``hybrid``): each unit's first rows go to the
    pool, the rest to the GPU process, both writing into the unit's shared-memory slot at once, split by the
    rates each side reached so far. Inside the job nvJPEG reaches a fraction of its rate alone: in its own
    process, the GPU time-slices between its CUDA context and ONNX Runtime's, and nvJPEG's short synchronised
    steps wait out the other context's slices (benchmarks/history/nvjpeg_probe.py; see docs/BENCHMARKS.md).
    Hybrid was slower than nvJPEG alone (both sides lost rate: they share the cores)."""

    def __init__(self, worker: BatchWorker, pool: DecodePool, split: bool = True):
        super().__init__(worker, pool)
        self.split = split
        self.gpu_share = 0.5 if split else 1.0
        self.rates = {"cpu": None, "gpu": None}  # images/s, smoothed
        self.images = {"cpu": 0, "gpu": 0}

    def start(self, unit: Unit):
        slot = self.free.get()
        rels, paths = self.files(unit)
        cut = len(paths) - round(len(paths) * self.gpu_share)
        cpu = self.pool.submit(slot, paths[:cut]) if cut else []
        gpu = self.pool.submit_gpu(slot, cut, paths[cut:]) if cut < len(paths) else None
        return unit, slot, rels, cpu, gpu, cut, time.perf_counter()

    def finish(self, pending, times: StageTimes):
        unit, slot, rels, cpu, gpu, cut, started = pending
        bad_rows: dict[int, str] = {}
        if gpu is not None:
            rows, seconds = gpu.result()
            bad_rows.update(rows)
            times.decode_s += seconds
            self._learn("gpu", len(rels) - cut, seconds)
        self._gather(cpu, cut, bad_rows, times)
        bad = _bad_rows(self.worker, unit, rels, bad_rows)
        feeds = {self.worker.model.inputs[0].name: self.pool.view(slot, unit.rows)}
        return unit, (rels, feeds, time.perf_counter() - started, bad), slot

    def _gather(self, cpu: list, cut: int, bad_rows: dict[int, str], times: StageTimes) -> None:
        """Wait for the CPU pool's part of a unit (its first ``cut`` rows), learn its rate, and move the split
        towards the rates both sides reach."""
        cpu_s = 0.0
        for future in cpu:
            rows, seconds = future.result()
            bad_rows.update(rows)
            times.decode_s += seconds
            cpu_s += seconds
        if cut:
            self._learn("cpu", cut, cpu_s / max(1, min(len(cpu), self.pool.workers)))
        rates = self.rates
        if self.split and rates["cpu"] and rates["gpu"]:
            self.gpu_share = min(0.95, max(0.05, rates["gpu"] / (rates["cpu"] + rates["gpu"])))

    def _learn(self, side: str, images: int, seconds: float) -> None:
        self.images[side] += images
        if seconds <= 0:
            return
        rate = images / seconds
        old = self.rates[side]
        self.rates[side] = rate if old is None else 0.8 * old + 0.2 * rate

    def phase_note(self) -> list[str]:
        """Where the GPU decoding process's time went (its decoder's phases), as a report line."""
        phases = self.pool.gpu_phases()
        images = phases.pop("images", 0)
        if not images:
            return []
        busy = sum(phases.values())
        parts = ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in phases.items())
        return [f"GPU decoding process: {images} images in {busy:.2f} s busy ({images / max(busy, 1e-9):,.0f}/s): "
                f"{parts}"]

    def summary(self) -> str:
        """Who decoded how many images, at what rate."""
        total = max(1, sum(self.images.values()))
        rates = ", ".join(f"{k} {v:,.0f}/s" for k, v in self.rates.items() if v)
        return (f"hybrid decode: nvJPEG {self.images['gpu']} images ({100 * self.images['gpu'] / total:.0f}%), CPU "
                f"pool {self.images['cpu']}; rates {rates}")


class _DeviceDecodeSource:
    """nvJPEG in the job's own process and CUDA context, on GPU_DECODE_THREADS threads (a decoder and stream
    each): a unit's batch stays on the GPU and the run copies it device to device into its bound input
    (RunnerPool's direct copies), with no copy back to the host and none to the device again. In a process of its
    own, nvJPEG took turns with the model's context on the GPU (time-slicing) and lost most of its rate
    (benchmarks/history/nvjpeg_probe.py); here its kernels and the model's share one context. A decode holds the
    capture gate shared (no CUDA call of ours during a graph capture). ``inline``: height, width, preset, device.
    The decoder is GPU_DECODER_CLASS, made with (height, width, preset, device, batch=the job's batch), with
    ``decode_device(paths)``: an array on the device given through ``__cuda_array_interface__``, its work
    finished, and {row: error}."""

    def __init__(self, worker: BatchWorker, inline: tuple, threads: int | None = None):
        import importlib

        threads = threads or _gpu_decode_threads()
        height, width, pre, device = inline
        module, _, cls = GPU_DECODER_CLASS.partition(":")
        make = getattr(importlib.import_module(module), cls)
        self.worker = worker
        try:
            self.decoders = [make(height, width, pre, device, batch=worker.spec.batch)  # here, not later
                             for _ in range(max(1, threads))]
        except Exception as exc:
            from onnxaccel.errors import ProviderUnavailableError

            raise ProviderUnavailableError(
                f"The GPU JPEG decoder (nvJPEG) could not start on device {device}: {type(exc).__name__}: {exc}.",
                "Check the GPU with `onnxaccel doctor`, or pass --decoder cpu-pool.") from exc
        self._free: queue.Queue = queue.Queue()
        for decoder in self.decoders:
            self._free.put(decoder)
        self.threads = ThreadPoolExecutor(len(self.decoders), thread_name_prefix="onnxaccel-batch-nvjpeg")

    def _decode(self, paths: list[str]):
        decoder = self._free.get()
        try:
            start = time.perf_counter()
            with CAPTURE_GATE.shared():
                pixels, bad = decoder.decode_device(paths)
            return pixels, bad, time.perf_counter() - start
        finally:
            self._free.put(decoder)

    def start(self, unit: Unit):
        rels, paths = _unit_files(self.worker, unit)
        return unit, rels, self.threads.submit(self._decode, paths), time.perf_counter()

    def finish(self, pending, times: StageTimes):
        unit, rels, future, started = pending
        pixels, bad_rows, seconds = future.result()
        times.decode_s += seconds
        bad = _bad_rows(self.worker, unit, rels, bad_rows)
        feeds = {self.worker.model.inputs[0].name: pixels}
        # The batch is the "slot": held (with its device memory) until its run is done, then dropped.
        return unit, (rels, feeds, time.perf_counter() - started, bad), pixels

    def release(self, slot) -> None:
        pass

    def phase_note(self) -> list[str]:
        """Where the decoding threads' time went (their decoders' phases summed), as a report line."""
        phases: dict[str, float] = {}
        for decoder in self.decoders:
            for key, value in getattr(decoder, "phases", {}).items():
                phases[key] = phases.get(key, 0) + value
        images = phases.pop("images", 0)
        if not images:
            return []
        busy = sum(phases.values())
        parts = ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in phases.items() if v)
        library = getattr(self.decoders[0], "library", None)
        via = f" through {LIBRARY_NAMES.get(library, library)}" if library else ""
        fallback = sum(getattr(decoder, "fallback_images", 0) for decoder in self.decoders)
        used = next((d._fallback.library for d in self.decoders if getattr(d, "_fallback", None) is not None), None)
        other = (f"; {fallback} of them through {LIBRARY_NAMES.get(used, used)} (not JPEG, or in a batch "
                 f"{LIBRARY_NAMES.get(library, library)} could not decode)") if fallback else ""
        return [f"nvJPEG{via} in this process ({len(self.decoders)} threads): {images} images in {busy:.2f} s busy "
                f"({images / max(busy, 1e-9):,.0f}/s per thread-second): {parts}{other}"]

    def close(self) -> None:
        self.threads.shutdown(wait=True, cancel_futures=True)


class _DeviceHybridSource(_HybridSource):
    """``hybrid`` with nvJPEG in the job's own process: each unit's first rows are decoded by the CPU pool into
    the unit's slot of (page-locked) shared memory, the rest by nvJPEG on the GPU (_DeviceDecodeSource's threads),
    split by the rates each side reached; the run copies the host rows (host to device) and the device rows
    (device to device) each into its rows of the bound input, no host join (engines/pool.py _run_direct)."""

    def __init__(self, worker: BatchWorker, pool: DecodePool, inline: tuple):
        super().__init__(worker, pool, split=True)
        self.device = _DeviceDecodeSource(worker, inline)

    def start(self, unit: Unit):
        slot = self.free.get()
        rels, paths = self.files(unit)
        cut = len(paths) - round(len(paths) * self.gpu_share)
        cpu = self.pool.submit(slot, paths[:cut]) if cut else []
        gpu = self.device.threads.submit(self.device._decode, paths[cut:]) if cut < len(paths) else None
        return unit, slot, rels, cpu, gpu, cut, time.perf_counter()

    def finish(self, pending, times: StageTimes):
        unit, slot, rels, cpu, gpu, cut, started = pending
        bad_rows: dict[int, str] = {}
        name = self.worker.model.inputs[0].name
        parts = []
        pixels = None
        if gpu is not None:
            pixels, rows, seconds = gpu.result()
            bad_rows.update({cut + i: message for i, message in rows.items()})
            times.decode_s += seconds
            self._learn("gpu", len(rels) - cut, seconds)
        self._gather(cpu, cut, bad_rows, times)
        if cut:
            parts.append({name: self.pool.view(slot, cut)})
        if pixels is not None:
            parts.append({name: pixels})
        bad = _bad_rows(self.worker, unit, rels, bad_rows)
        feeds = parts if len(parts) > 1 else parts[0]
        # The slot, and the device batch (its memory held until the run is done).
        return unit, (rels, feeds, time.perf_counter() - started, bad), (slot, pixels)

    def release(self, slot) -> None:
        if slot is not None:
            super().release(slot[0])

    def phase_note(self) -> list[str]:
        return self.device.phase_note()

    def close(self) -> None:
        self.device.close()
        super().close()
