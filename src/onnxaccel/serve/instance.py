"""A served model: its runners (one per instance), its signature, request validation, one execution.

A model batches dynamically when every input and every output has a variable first axis (a dim_param or
unknown, as exporters write a dynamic batch): requests are then joined along axis 0 and the outputs split
back by the same row counts. A model with a fixed first axis runs each request as sent.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.engines import Runner
from onnxaccel.engines.hostmem import DeviceCopier, HostMemory, is_pinned, runtime_for
from onnxaccel.model import Model, TensorSpec
from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.protocol import InferRequest, ProtocolError, bad_request, datatype_of

logger = logging.getLogger(__name__)

VERSION = "1"
PLATFORM = "onnxruntime_onnx"  # Triton's platform name for ONNX models (model_config.proto "platform")


def _variable(dim) -> bool:
    return not isinstance(dim, int)


def has_batch_axis(model: Model) -> bool:
    specs = list(model.inputs) + list(model.outputs)
    return bool(specs) and all(s.shape is not None and len(s.shape) >= 1 and _variable(s.shape[0]) for s in specs)


def graph_capture_possible(model: Model) -> bool:
    """A captured graph replays fixed shapes: served in padded batch sizes, that needs a batch axis and every
    other axis of every input and output fixed (else a request of another shape would meet a graph bound to
    the warm-up's shape)."""
    specs = list(model.inputs) + list(model.outputs)
    return has_batch_axis(model) and all(all(isinstance(d, int) for d in s.shape[1:]) for s in specs)


def metadata_shape(spec: TensorSpec) -> list[int]:
    return [-1 if _variable(d) else int(d) for d in spec.shape] if spec.shape is not None else [-1]

@dataclass
class ModelSignature:
    """What serving a model needs to know without running it: request validation, the protocol's model
    metadata and Triton's model config. A :class:`ModelInstance` has one; with ``--shared-models`` the
    decoding workers get only this from the model process (serve/model_host.py)."""

    config: ModelConfig
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batching: bool
    gpu: bool

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.outputs]

    # -- metadata -------------------------------------------------------------------------------------

    @property
    def max_batch(self) -> int:
        return self.config.max_batch if self.batching else 0

    def metadata(self) -> dict:
        return {
            "name": self.config.name, "versions": [VERSION], "platform": PLATFORM,
            "inputs": [{"name": s.name, "datatype": datatype_of(s.dtype), "shape": metadata_shape(s)}
                       for s in self.inputs],
            "outputs": [{"name": s.name, "datatype": datatype_of(s.dtype), "shape": metadata_shape(s)}
                        for s in self.outputs],
        }

    def triton_config(self) -> dict:
        """Triton's model configuration as JSON (model_config.proto), for clients that read it."""
        drop = 1 if self.batching else 0  # Triton's dims leave out the batch axis when max_batch_size > 0

        def dims(spec: TensorSpec) -> list[int]:
            return metadata_shape(spec)[drop:]

        config = {
            "name": self.config.name, "platform": PLATFORM, "backend": "onnxruntime",
            "max_batch_size": self.max_batch,
            "input": [{"name": s.name, "data_type": "TYPE_" + _triton_type(s.dtype), "dims": dims(s)}
                      for s in self.inputs],
            "output": [{"name": s.name, "data_type": "TYPE_" + _triton_type(s.dtype), "dims": dims(s)}
                       for s in self.outputs],
            "instance_group": [{"name": self.config.name, "count": self.config.instances,
                                "kind": "KIND_GPU" if self.gpu else "KIND_CPU"}],
        }
        if self.batching:
            config["dynamic_batching"] = {
                "max_queue_delay_microseconds": int(self.config.max_queue_delay_ms * 1000)}
        return config

    # -- requests --------------------------------------------------------------------------------------

    def validate(self, request: InferRequest) -> tuple[dict[str, np.ndarray], int]:
        """Check names, datatypes and shapes against the signature; return the feeds and their row count."""
        names = [s.name for s in self.inputs]
        unknown = [n for n in request.inputs if n not in names]
        if unknown:
            raise bad_request(f"Model '{self.config.name}' has no input named '{unknown[0]}'; its inputs are: "
                              f"{', '.join(names)}.")
        missing = [n for n in names if n not in request.inputs]
        if missing:
            raise bad_request(f"The request has no value for input(s) {', '.join(missing)} of model "
                              f"'{self.config.name}'.")
        rows = None
        feeds = {}
        for spec in self.inputs:
            value = request.inputs[spec.name]
            want = datatype_of(spec.dtype)
            sent = request.datatypes.get(spec.name, datatype_of(value.dtype))
            if sent != want:
                raise bad_request(f"Input '{spec.name}' of model '{self.config.name}' is {want}; the request "
                                  f"sends {sent}.")
            _check_shape(spec, value.shape, self.config.name)
            if self.batching:
                n = value.shape[0]
                if rows is not None and n != rows:
                    raise bad_request(f"The inputs of model '{self.config.name}' must share their first (batch) "
                                      f"axis; '{spec.name}' has {n} rows, another input {rows}.")
                rows = n
                if n > self.config.max_batch:
                    raise bad_request(f"Input '{spec.name}' has batch {n}, above the model's max_batch "
                                      f"{self.config.max_batch}; split the request.")
                if n == 0:
                    raise bad_request(f"Input '{spec.name}' has an empty batch axis.")
            feeds[spec.name] = _as_text(value, spec.name) if value.dtype == object else value
        if request.outputs:
            for out in request.outputs:
                if out.name not in self.output_names:
                    raise bad_request(f"Model '{self.config.name}' has no output named '{out.name}'; its outputs "
                                      f"are: {', '.join(self.output_names)}.")
        return feeds, rows or 1

    def batch_key(self, feeds: Mapping[str, np.ndarray]) -> tuple:
        """Requests with equal keys can be joined along axis 0 (same trailing shapes)."""
        return tuple((name, value.shape[1:]) for name, value in feeds.items())


@dataclass
class ModelInstance:
    """The compiled runners of one model and what the batcher needs to know about it."""

    config: ModelConfig
    model: Model
    runners: list[Runner]
    warnings: list[str] = field(default_factory=list)
    load_seconds: float = 0.0
    #: Per instance, a session per padded batch size (see ``repository.load_instance``); empty: one session.
    size_runners: list[dict[int, Runner]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.batching = has_batch_axis(self.model) and self.config.max_batch > 1
        self.output_names = [o.name for o in self.model.outputs]
        self._run_options = _run_options(self.runners[0], self.config) if self.runners else None
        gpu = bool(self.runners) and self.runners[0].target.is_gpu
        self.signature = ModelSignature(self.config, list(self.model.inputs), list(self.model.outputs),
                                        self.batching, gpu)
        #: On GPUs every new input shape costs a fresh kernel search (cuDNN's algorithm search on CUDA, a
        #: recompile on MIGraphX): measured on an H200, dynamic batches of every size 1..64 made ResNet-50
        #: spend ~1.3 s per request in search. So batches are padded to a few sizes (powers of two up to
        #: max_batch), each warmed once at load, as Triton's preferred batch sizes do. CPUs run as joined.
        self.buckets = _buckets(self.config.max_batch) if self.batching and gpu else ()
        #: Per instance, the reused host buffers that batches are joined into: page-locked on GPUs (one DMA
        #: per batch instead of the driver's chunked copy from pageable memory) and never freshly allocated
        #: (no page faults in the run thread). One per instance: each is used by its run thread only.
        runtime = runtime_for(self.runners[0].target.device) if gpu else None
        keep = max(16, 2 * len(self.model.inputs))
        device_id = (self.runners[0].target.device_id or 0) if gpu else 0
        self.host = [HostMemory(runtime, keep=keep, device_id=device_id) for _ in self.runners]
        #: Graph capture (the target's enable_cuda_graph=1 and the like; kept only for models run in padded
        #: sizes, one session each: see repository.load_instance): per (instance, size), inputs and outputs
        #: bound once on the device (IO binding); a batch is copied into the bound inputs and the graph replayed,
        #: without launching each kernel from the CPU. Set up by warm_up.
        self.graph = bool(self.buckets) and self.runners[0].target.graph_capture
        #: One thread per instance, which runs all of that instance's work, warm-up included. ONNX Runtime's
        #: CUDA EP keeps its captured graph per thread (cuda_execution_provider.h PerThreadContext holds
        #: cuda_graph_): runs from another thread would capture again, while other instances run, which
        #: fails ("operation not permitted when stream is capturing", seen on an H200 with a shared pool).
        self.threads = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"run-{self.config.name}-{i}")
                        for i in range(len(self.runners))]
        self.bound: dict[tuple[int, int], object] = {}
        #: Per instance, with graph capture: copies of requests straight from page-locked memory (the arenas of
        #: --shared-models, pinned by the model process) into the bound device inputs, without the host join;
        #: None once a copy failed (the reason in direct_copy_note; batches then join on the host).
        self.copiers: list[DeviceCopier | None] = [
            DeviceCopier(runtime, device_id) if self.graph and runtime else None for _ in self.runners]
        self.direct_copy_note = ""
        #: Per instance, the seconds of each phase of its last batch (join, then run, or copy_in, replay and
        #: copy_out with graphs); read by the batcher for the batch-phase metric after the run.
        self.phases: list[dict[str, float]] = [{} for _ in self.runners]
        if self.graph:
            self._run_options = None  # no arena shrinkage under a captured graph (config.resolved_target notes it)

    # -- signature (see ModelSignature) ---------------------------------------------------------------

    @property
    def max_batch(self) -> int:
        return self.signature.max_batch

    def metadata(self) -> dict:
        return self.signature.metadata()

    def triton_config(self) -> dict:
        return self.signature.triton_config()

    def validate(self, request: InferRequest) -> tuple[dict[str, np.ndarray], int]:
        return self.signature.validate(request)

    def batch_key(self, feeds: Mapping[str, np.ndarray]) -> tuple:
        return self.signature.batch_key(feeds)

    # -- running ---------------------------------------------------------------------------------------

    def execute(self, index: int, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """Run one request's feeds on instance ``index`` (padded to a warmed size); outputs and seconds."""
        return self.execute_joined(index, [feeds])

    def execute_joined(self, index: int, parts: list[Mapping[str, np.ndarray]]
                       ) -> tuple[dict[str, np.ndarray], float]:
        """Join ``parts`` along axis 0 straight into one buffer of the padded size (one copy per request,
        not a concatenate and then a padding copy), run on instance ``index``; the outputs of the real rows
        and the seconds of the run."""
        if not self.buckets:  # CPU: no graphs, no gate
            return self._execute_joined(index, parts)
        with GPU_GATE.shared():
            return self._execute_joined(index, parts)

    def _execute_joined(self, index: int, parts: list[Mapping[str, np.ndarray]]
                        ) -> tuple[dict[str, np.ndarray], float]:
        pinned = self.host[index].pinned if self.host else False
        if len(parts) == 1 and not self.buckets:
            return self._execute(index, parts[0])
        names = list(parts[0])
        rows = sum(next(iter(p.values())).shape[0] for p in parts) if names else 0
        size = next((b for b in self.buckets if b >= rows), rows)
        if self.graph and self.copiers[index] is not None:
            direct = self._execute_direct(index, parts, rows, size)
            if direct is not None:
                return direct
        if len(parts) == 1 and size == rows and not pinned:
            return self._execute(index, parts[0])
        joined = {}
        start = time.perf_counter()
        for name in names:
            first = parts[0][name]
            buffer = self._buffer(index, name, (size, *first.shape[1:]), first.dtype)
            _join_rows(buffer, [part[name] for part in parts])
            joined[name] = buffer
        join_s = time.perf_counter() - start
        outputs, seconds = self._execute(index, joined)
        self.phases[index]["join"] = join_s
        return _real_rows(outputs, rows, size), seconds

    def _execute_direct(self, index: int, parts: list[Mapping[str, np.ndarray]], rows: int, size: int
                        ) -> tuple[dict[str, np.ndarray], float] | None:
        """With graph capture, where every part lies in page-locked memory: copy each part straight into its
        rows of the bound device inputs (the rows past ``rows`` keep an earlier batch's values: padding, whose
        results are dropped), replay, and return the real rows' outputs. None where it does not apply."""
        bound = self.bound.get((index, size))
        addresses = bound.input_addresses() if bound is not None else None
        if not addresses or set(addresses) != set(parts[0]):
            return None
        pieces = {}
        for name in addresses:
            values = [part[name] for part in parts]
            if not all(v.flags.c_contiguous and v.dtype != np.dtype(object) and is_pinned(v.ctypes.data, v.nbytes)
                       for v in values):
                return None
            pieces[name] = [(v.ctypes.data, v.nbytes) for v in values]
        start = time.perf_counter()
        try:
            self.copiers[index].copy([(address, pieces[name]) for name, address in addresses.items()])
        except RuntimeError as exc:  # the host join still works: use it from now on, and say why
            self.copiers[index].close()
            self.copiers[index] = None
            self.direct_copy_note = f"direct copies to the GPU failed ({exc}); batches are joined on the host"
            logger.warning("model '%s', instance %d: %s", self.config.name, index, self.direct_copy_note)
            return None
        outputs, seconds = self._replay(index, bound, start)
        return _real_rows(outputs, rows, size), seconds

    def fit_rows(self, waiting: int) -> int:
        """How many of ``waiting`` rows the next batch should take: all (up to max_batch), unless the model runs
        in padded sizes and their padding would exceed ``max_padding`` of the batch; then the padded size below
        (17 waiting rows: 16, not 32 with 15 of padding; the row left over goes with the next batch)."""
        limit = min(waiting, self.max_batch) if self.batching else waiting
        if not self.buckets or limit >= self.max_batch:
            return limit
        padded = next((b for b in self.buckets if b >= limit), limit)
        if padded - limit <= self.config.max_padding * padded:
            return limit
        return max((b for b in self.buckets if b <= limit), default=limit)

    def padding_share(self, rows: int) -> float:
        """The share of padding in a batch of ``rows`` run at its padded size (0 without padded sizes)."""
        padded = next((b for b in self.buckets if b >= rows), rows)
        return (padded - rows) / padded if padded else 0.0

    def _buffer(self, index: int, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        """Instance ``index``'s reused (page-locked where possible) buffer for input ``name``; strings get a
        fresh array (object arrays hold references, not bytes a device can copy)."""
        if np.dtype(dtype) == np.dtype(object) or not self.host:
            return np.empty(shape, dtype=dtype)
        return self.host[index].buffer(name, shape, dtype)

    def warm_up(self) -> list[int]:
        """Run every padded batch size once on every instance, so no request pays for a kernel search."""
        done = []
        for size in sorted(self.buckets, reverse=True):  # largest first: one buffer, then views of it
            for index in range(len(self.runners)):
                feeds = {}
                for spec in self.model.inputs:
                    trailing = self.model.input_shapes.get(spec.name, ())[1:]
                    # From the instance's own buffers, so they are allocated (and pinned) at load.
                    feeds[spec.name] = self._buffer(index, spec.name, (size, *trailing), np.dtype(spec.dtype))
                    feeds[spec.name][...] = 0
                # In the instance's own thread, one instance at a time; a graph capture excludes every other
                # batch in the process (GPU_GATE).
                if self.graph:
                    with GPU_GATE.exclusive():
                        self.threads[index].submit(self._execute, index, feeds).result()
                else:
                    self.threads[index].submit(self._execute, index, feeds).result()
            done.append(size)
        return sorted(done)

    def _execute(self, index: int, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        runner = self.runners[index]
        size = next(iter(feeds.values())).shape[0] if feeds else 0
        if self.size_runners and feeds:
            runner = self.size_runners[index].get(size, runner)
        start = time.perf_counter()
        if self.graph:
            bound = self.bound.get((index, size))
            if bound is None:  # at warm-up: bind, and run until ONNX Runtime has captured the graph
                bound = self.bound[(index, size)] = runner.bind(feeds, fixed_outputs=self._output_shapes(size))
                for _ in range(GRAPH_WARM_RUNS):
                    bound.run()
            bound.update(feeds)
            return self._replay(index, bound, start)
        if self._run_options is not None:
            session = runner.session  # OrtRunner: run with RunOptions (arena shrinkage)
            values = session.run(self.output_names, dict(feeds), self._run_options)
            outputs = dict(zip(self.output_names, values))
        else:
            outputs = runner.run(feeds)
        seconds = time.perf_counter() - start
        self.phases[index] = {"run": seconds}
        return outputs, seconds

    def _replay(self, index: int, bound, start: float) -> tuple[dict[str, np.ndarray], float]:
        """Replay ``bound`` once its inputs were copied in (since ``start``): the outputs and the seconds since
        ``start``, with the phases (copy_in, replay, copy_out) recorded for the metric."""
        copied = time.perf_counter()
        bound.run()
        replayed = time.perf_counter()
        outputs = bound.outputs()
        end = time.perf_counter()
        self.phases[index] = {"copy_in": copied - start, "replay": replayed - copied, "copy_out": end - replayed}
        return outputs, end - start

    def _output_shapes(self, size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Each output's shape and dtype at batch ``size``, from the signature: a captured graph has fixed
        shapes, so every axis but the batch axis must be fixed in the model."""
        shapes = {}
        for spec in self.model.outputs:
            rest = spec.shape[1:] if spec.shape else None
            if rest is None or not all(isinstance(d, int) for d in rest):
                raise ValueError(f"output '{spec.name}' has shape {metadata_shape(spec)}: graph capture needs every "
                                 "axis but the batch axis fixed")
            shapes[spec.name] = ((size, *rest), np.dtype(spec.dtype))
        return shapes

    def close(self) -> None:
        for thread in self.threads:
            thread.shutdown(wait=True)
        for copier in self.copiers:
            if copier is not None:
                copier.close()
        self.bound.clear()
        for host in self.host:  # before the sessions: nothing runs on the buffers any more
            host.close()
        for runner in self.runners:
            runner.close()
        for sizes in self.size_runners:
            for runner in sizes.values():
                if runner not in self.runners:
                    runner.close()


class CaptureGate:
    """Graph captures exclusive against every GPU batch of the process (a readers-writer lock, writers first).

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


#: The process's gate (see CaptureGate).
GPU_GATE = CaptureGate()

#: Runs of a newly bound session at warm-up, so that ONNX Runtime has captured its graph before serving (it
#: captures after its first regular runs: cuda_execution_provider.cc kMinNumRunsBeforeCudaGraphCapture, 2).
GRAPH_WARM_RUNS = 3

#: Whether batch joins keep the GIL (see _join_rows). A process-wide choice, because it depends on what else
#: the process runs: True where an event loop decodes requests in the same process; the model process of
#: ``--shared-models`` (serve/model_host.py), whose loop only passes messages, sets it False so that joins of
#: several instances and the loop run at the same time.
JOIN_HOLDS_GIL = True

#: memmove that keeps the GIL (ctypes.memmove releases it, as numpy's copies do). See _join_rows.
_memmove_holding_gil = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)(
    ctypes.cast(ctypes.memmove, ctypes.c_void_p).value)


def _join_rows(buffer: np.ndarray, values: list[np.ndarray]) -> None:
    """Copy ``values`` one after another into the first rows of ``buffer``; fill the rest with copies
    of the last row (padding: rows are independent, so the real rows' results are unchanged).

    In the server this runs in a run thread while the event loop thread holds the GIL most of the time.
    numpy releases the GIL for each large copy and must then wait to get it back (up to the switch interval
    each time): joining 64 rows of 600 kB that way took 52 ms instead of 8 ms while another thread ran
    Python (2-core development machine, switch interval 0.5 ms; benchmarks/serve_session_probe.py measures
    it on the GPU machine). memmove calls that keep the GIL wait once per switch interval of copying instead
    of once per row.
    """
    contiguous = buffer.flags.c_contiguous and buffer.dtype != np.dtype(object)
    at = 0
    for value in values:
        n = value.shape[0]
        if at + n > buffer.shape[0]:
            raise ValueError(f"the parts hold more than the buffer's {buffer.shape[0]} rows")
        if (contiguous and value.flags.c_contiguous and value.dtype == buffer.dtype
                and value.shape[1:] == buffer.shape[1:]):
            step = value.nbytes // n if n else 0
            copy = _memmove_holding_gil if JOIN_HOLDS_GIL else ctypes.memmove
            copy(buffer.ctypes.data + at * step, value.ctypes.data, value.nbytes)
        else:
            buffer[at:at + n] = value
        at += n
    if at < buffer.shape[0]:
        buffer[at:] = buffer[at - 1]


def _real_rows(outputs: dict[str, np.ndarray], rows: int, size: int) -> dict[str, np.ndarray]:
    """The outputs of a batch padded from ``rows`` to ``size``, without the padding rows (views)."""
    if size == rows:
        return outputs
    return {n: (v[:rows] if v.ndim and v.shape[0] == size else v) for n, v in outputs.items()}


def _buckets(max_batch: int) -> tuple[int, ...]:
    sizes = {1, max_batch}
    size = 2
    while size < max_batch:
        sizes.add(size)
        size *= 2
    return tuple(sorted(sizes))


def _check_shape(spec: TensorSpec, shape: tuple[int, ...], model: str) -> None:
    if spec.shape is None:
        return
    if len(shape) != len(spec.shape):
        raise bad_request(f"Input '{spec.name}' of model '{model}' has rank {len(spec.shape)} "
                          f"{metadata_shape(spec)}; the request sends shape {list(shape)}.")
    for axis, (want, got) in enumerate(zip(spec.shape, shape)):
        if isinstance(want, int) and want != got:
            raise bad_request(f"Input '{spec.name}' of model '{model}' must have {want} on axis {axis} "
                              f"(shape {metadata_shape(spec)}); the request sends shape {list(shape)}.")


def _as_text(value: np.ndarray, name: str) -> np.ndarray:
    """BYTES elements as str: ONNX string tensors hold UTF-8 text, and onnxruntime turns a bytes object into
    its repr (b'...') rather than decoding it (seen with onnxruntime 1.32)."""
    try:
        return np.array([v.decode() if isinstance(v, bytes) else v for v in value.reshape(-1)],
                        dtype=object).reshape(value.shape)
    except UnicodeDecodeError as exc:
        raise bad_request(f"Input '{name}' is an ONNX string tensor, which holds UTF-8 text; element bytes are not "
                          f"UTF-8 ({exc.reason} at byte {exc.start}).") from None


def _triton_type(dtype: str) -> str:
    name = datatype_of(dtype)
    return "STRING" if name == "BYTES" else name


def _run_options(runner: Runner, config: ModelConfig):
    """RunOptions with arena shrinkage, for ONNX Runtime runners when the config asks for it.

    Key and value format from onnxruntime include/onnxruntime/core/session/onnxruntime_run_options_config_keys.h
    (kOrtRunOptionsConfigEnableMemoryArenaShrinkage): "cpu:0;gpu:0"; "cpu" only while the CPU arena is on.
    """
    if not config.arena_shrinkage or not hasattr(runner, "session") or not hasattr(runner, "ort"):
        return None
    target = runner.target
    devices = []
    if target.option_dict.get("enable_cpu_mem_arena", "1") != "0":
        devices.append("cpu:0")
    if target.is_gpu:
        devices.append(f"gpu:{target.device_id or 0}")
    if not devices:
        return None
    options = runner.ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", ";".join(devices))
    return options


def unavailable(name: str, reason: str) -> ProtocolError:
    return ProtocolError(503, f"Model '{name}' is not ready: {reason}")
