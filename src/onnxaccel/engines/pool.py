"""Several instances of one model side by side: the one way onnxaccel runs more than one session of a model.

A :class:`RunnerPool` holds N instances. Each has a thread of its own that builds, warms and runs it (ONNX
Runtime's CUDA EP keeps a captured graph per thread: cuda_execution_provider.h PerThreadContext holds
cuda_graph_, so runs from another thread would capture again), optionally a session per shape bucket (padded
batch size), inputs and outputs bound on the device once per bucket for graph replay, reused page-locked host
buffers that batches are joined into, and direct copies from page-locked memory into the bound inputs. Graph
captures take the process's one :data:`CAPTURE_GATE` exclusively; padded GPU runs hold it shared. Where asked,
the instances' runs take turns (:class:`~onnxaccel.engines.pool_io.RunTurns`).

Built as Polygraphy builds runners: construction (``RunnerPool.build``: a factory called in each instance's
thread) apart from activation (``warm_up``; ``warm_step`` for sizes warmed after the pool went into service:
engines/pool_warm.py). ``run(index, feeds)`` and ``run_rows(index, parts)`` are called
in instance ``index``'s thread (``submit`` puts work there): serve's batcher runs batches through them, and
bench's ``--instances``/``--concurrency`` loops take ``call(index, feeds)`` for their timed calls.

Feeds reach the pool checked (serve checks each request at the protocol edge, serve/signature.py; ``call``
checks once, before the timed calls): its runs call ``Runner.run_unchecked``, which adds nothing to a run the
runtime takes and still words one it refuses.

For what the GPU parts (pinning, direct copies, graph replay) gain, see docs/BENCHMARKS.md; the HIP paths are
written to the HIP runtime API and never ran on AMD hardware.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from onnxaccel import startup
from onnxaccel.engines.base import Runner
from onnxaccel.engines.gpu_runtime import runtime_for
from onnxaccel.engines.hostmem import DEVICE_TO_DEVICE, GPU_WAIT, HOST_TO_DEVICE, DeviceCopier, HostMemory, is_pinned
from onnxaccel.engines.hostmem import pin, unpin
from onnxaccel.engines.hostmem import set_gpu_wait as _set_gpu_wait
from onnxaccel.engines.pool_io import (CAPTURE_GATE, CaptureGate, RunTurns, device_address, join_rows, on_device,
                                      real_rows, to_host)
from onnxaccel.engines.pool_warm import JoinLater, WarmingLater, WarmLater, make_instances
from onnxaccel.model import Model
from onnxaccel.target import Target

logger = logging.getLogger(__name__)

__all__ = ["CAPTURE_GATE", "GPU_WAIT_MODES", "GRAPH_WARM_RUNS", "CaptureGate", "RunnerPool", "pin_for_copies",
           "set_gpu_wait", "unpin_for_copies"]

#: Runs of a newly bound session at warm-up, so that ONNX Runtime has captured its graph before real work (it
#: captures after its first regular runs: cuda_execution_provider.cc kMinNumRunsBeforeCudaGraphCapture, 2).
GRAPH_WARM_RUNS = 3

#: How a run thread may wait for the GPU (engines/hostmem.py GPU_WAIT_EFFECT says what each does per runtime).
GPU_WAIT_MODES = tuple(GPU_WAIT)


class RunnerPool(WarmingLater):
    """N instances of one model on one target, each run by a thread of its own.

    ``runners``: one per instance (the same runner several times for threads sharing one session, as bench's
    ``--concurrency`` does). ``sessions``: per instance, a runner per bucket size (the instance's runner serves
    the sizes without one); the list may be filled after construction, before ``warm_up``. ``buckets``: the
    padded sizes of the first axis (empty: feeds run as given). ``graph``: per (instance, size) inputs and
    outputs bound once and replayed (the target captures a graph); needs buckets. ``owns``: ``close`` closes
    the runners too. ``one_capture_at_a_time``: warm-ups hold the capture gate exclusively (default: with
    ``graph``). ``join_holds_gil``: see :func:`engines.pool_io.join_rows`; False where no event loop of the
    process decodes requests (serve's model process). ``planned``: the instances planned, when some join later
    (:meth:`join_step`); the first ``len(runners)`` serve from the start. ``one_run_at_a_time``: the instances'
    runs take turns (a lock around the run alone: copies in and out and the host work of one instance go on
    beside another's run), so that on a GPU each run has the device to itself (serve's ``--streams serial``).
    """

    def __init__(self, runners: Sequence[Runner], *, model: Model | None = None,
                 sessions: list[dict[int, Runner]] | None = None, buckets: Sequence[int] = (), graph: bool = False,
                 arena_shrinkage: bool = False, join_holds_gil: bool = True, direct_copy: bool = True,
                 one_capture_at_a_time: bool | None = None, owns: bool = True, name: str = "pool",
                 threads: list[ThreadPoolExecutor] | None = None, gate: CaptureGate = CAPTURE_GATE,
                 planned: int | None = None, one_run_at_a_time: bool = False) -> None:
        if not runners:
            raise ValueError("a RunnerPool needs at least one runner")
        self.runners = list(runners)
        self.model = model if model is not None else self.runners[0].model
        self.sessions = sessions if sessions is not None else []
        self.buckets = tuple(buckets)
        self.graph = graph
        self.arena_shrinkage = arena_shrinkage
        self.join_holds_gil = join_holds_gil
        self.one_capture_at_a_time = graph if one_capture_at_a_time is None else one_capture_at_a_time
        self.owns = owns
        self.name = name
        self.gate = gate
        #: Whether runs take turns (``one_run_at_a_time``; the wait is the ``turn`` phase) or overlap.
        self.turns = RunTurns(one_run_at_a_time)
        self.target: Target = self.runners[0].target
        count = max(planned or 0, len(self.runners))
        #: Instances planned; the first ``in_service`` take work, the rest join later (:meth:`join_step`).
        self.planned = count
        self.in_service = len(self.runners)
        self.threads = threads or [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"run-{name}-{i}")
                                   for i in range(count)]
        gpu = self.target.is_gpu
        self._runtime = runtime_for(self.target.device) if gpu else None
        self._device_id = (self.target.device_id or 0) if gpu else 0
        #: Per instance, the reused host buffers batches are joined into (made at first use): page-locked on GPUs
        #: (one DMA per batch instead of the driver's chunked copy from pageable memory) and never freshly
        #: allocated (no page faults in the run thread). One per instance: each is used by its thread only.
        self.hosts: list[HostMemory | None] = [None] * count
        #: Per (instance, size) with ``graph``: the bound run, made at warm-up.
        self.bound: dict[tuple[int, int], object] = {}
        #: Per instance, with ``graph``: copies of requests straight from page-locked memory (pinned by the
        #: caller, e.g. the arenas of serve --shared-models) into the bound device inputs, without a host join;
        #: None once a copy failed (the reason in ``direct_copy_note``; batches are then joined on the host).
        self.copiers: list[DeviceCopier | None] = [
            DeviceCopier(self._runtime, self._device_id) if graph and direct_copy and self._runtime else None
            for _ in range(count)]
        self.direct_copy_note = ""
        #: Per instance, the seconds of each phase of its last run (join and run, or copy_in, replay and
        #: copy_out with graphs); read after the run (serve's batch-phase metric).
        self.phases: list[dict[str, float]] = [{} for _ in range(count)]
        #: Bucket sizes still to build and warm (RunnerPool.build ``warm_now``), None when there are none.
        self.later: WarmLater | None = None
        #: Instances still to build and warm (RunnerPool.build ``at_load``), None when there are none.
        self.joining: JoinLater | None = None
        #: Per instance that joined after the pool went into service, the seconds its build and warm-up took.
        self.joined_s: dict[int, float] = {}
        self._shrunk: set[int] = set()
        self._shrink_arenas(self.runners)

    @classmethod
    def build(cls, make: Callable[[], Runner], count: int, *, buckets: Sequence[int] = (),
              session_per_bucket: bool = False, warm_now: Sequence[int] | None = None,
              at_load: int | None = None, name: str = "pool", **settings) -> RunnerPool:
        """``count`` instances, each runner made by ``make()`` in the thread that will run it, the first instance
        alone and then the others side by side (engines/pool_warm.py make_instances; with ``session_per_bucket``
        one runner per bucket size). ``warm_now``: the bucket sizes used from the start (default: all); the
        others are built and warmed later by :meth:`warm_step`, and used once warm on every instance.
        ``at_load``: the instances built now (default: all); the others are built and warmed later by
        :meth:`join_step`, one at a time, each taking work once warm. Warm up with :meth:`warm_up`."""
        threads = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"run-{name}-{i}") for i in range(count)]
        now = tuple(sorted(warm_now)) if warm_now is not None else tuple(buckets)
        later = [size for size in buckets if size not in now]
        sizes = now if session_per_bucket else ()
        first = count if at_load is None else max(1, min(count, at_load))
        try:
            built = make_instances(make, threads[:first], sizes)
        except BaseException:
            for thread in threads:
                thread.shutdown(wait=True)
            raise
        runners = [instance.pop(None) for instance in built]
        sessions = [{sizes[0]: runner, **instance} for runner, instance in zip(runners, built)] if sizes else []
        pool = cls(runners, sessions=sessions, buckets=now if buckets else (), name=name, threads=threads,
                   planned=count, **settings)
        if later:
            pool.later = WarmLater(later, count, make if session_per_bucket else None)
        if first < count:
            pool.joining = JoinLater(make, sizes)
        return pool

    def __len__(self) -> int:
        return len(self.runners)

    # -- policy helpers -----------------------------------------------------------------------------------

    def bucket(self, rows: int) -> int:
        """The padded size ``rows`` run at: the smallest bucket that holds them (``rows`` without buckets, or
        past the largest). The one place this is computed."""
        return next((b for b in self.buckets if b >= rows), rows)

    # -- threads ------------------------------------------------------------------------------------------

    def submit(self, index: int, fn: Callable, *args) -> Future:
        """Run ``fn(*args)`` in instance ``index``'s thread."""
        return self.threads[index].submit(fn, *args)

    def call(self, index: int, feeds: Mapping[str, np.ndarray], *, iobinding: bool = True) -> Callable[[], object]:
        """The plain call a timing loop repeats on instance ``index`` (call it in that thread): its bound run
        (inputs bound on the device, in this thread) or its runner's ``run`` on ``feeds``. Nothing else is
        added to the call: the loop measures the model (the feeds are checked here, once)."""
        runner = self.runners[index]
        if iobinding:
            bound = self.bound[(index, -1)] = runner.bind(feeds)
            return bound.run
        runner.check_feeds(feeds)
        return functools.partial(runner.run_unchecked, dict(feeds))

    def bound_outputs(self, index: int) -> Callable[[], dict] | None:
        """The ``outputs`` of instance ``index``'s bound run made by :meth:`call`, if any."""
        bound = self.bound.get((index, -1))
        return bound.outputs if bound is not None else None

    def warm_turn(self):
        """The context a warm-up runs in: the capture gate held exclusively where asked, else nothing."""
        return self.gate.exclusive() if self.one_capture_at_a_time else contextlib.nullcontext()

    # -- running ------------------------------------------------------------------------------------------

    def run(self, index: int, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """:meth:`run_rows` of one part: the outputs of its real rows and the seconds (in ``index``'s thread)."""
        return self.run_rows(index, [feeds])

    def run_rows(self, index: int, parts: list[Mapping[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], float]:
        """Join ``parts`` along axis 0 straight into one buffer of the padded size (one copy per part, not a
        concatenate and then a padding copy) and run on instance ``index``: the outputs of the real rows and
        the seconds of the run. Padded (GPU) runs hold the capture gate shared."""
        if not self.buckets:  # CPU: no graphs, no gate
            return self._run_rows(index, parts)
        with self.gate.shared():
            return self._run_rows(index, parts)

    def _run_rows(self, index: int, parts: list[Mapping[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], float]:
        host = self.hosts[index]
        pinned = host.pinned if host is not None else False
        device_rows = any(on_device(v) for part in parts for v in part.values())
        if len(parts) == 1 and not self.buckets and not device_rows:
            return self._execute(index, parts[0])
        names = list(parts[0])
        rows = sum(next(iter(p.values())).shape[0] for p in parts) if names else 0
        size = self.bucket(rows)
        if self.graph and self.copiers[index] is not None:
            direct = self._run_direct(index, parts, rows, size)
            if direct is not None:
                return direct
        if device_rows:  # no direct copy (none here, it failed, or strided rows): to the host, joined there
            why = self.direct_copy_note or "no graph replay with direct copies"
            parts = [{name: to_host(value, f"'{self.name}' instance {index}: {why}") for name, value in part.items()}
                     for part in parts]
            if len(parts) == 1 and not self.buckets:
                return self._execute(index, parts[0])
        if len(parts) == 1 and size == rows and not pinned:
            return self._execute(index, parts[0])
        joined = {}
        start = time.perf_counter()
        for name in names:
            first = parts[0][name]
            buffer = self.buffer(index, name, (size, *first.shape[1:]), first.dtype)
            join_rows(buffer, [part[name] for part in parts], hold_gil=self.join_holds_gil)
            joined[name] = buffer
        join_s = time.perf_counter() - start
        outputs, seconds = self._execute(index, joined)
        self.phases[index]["join"] = join_s
        return real_rows(outputs, rows, size), seconds

    def _run_direct(self, index: int, parts: list[Mapping[str, np.ndarray]], rows: int, size: int
                    ) -> tuple[dict[str, np.ndarray], float] | None:
        """With graphs, where every part lies in page-locked memory or in device memory (given through
        ``__cuda_array_interface__``: copied device to device; parts of both kinds mixed): copy each part straight
        into its rows of
        the bound device inputs (the rows past ``rows`` keep an earlier run's values: padding, whose results are
        dropped), replay, and return the real rows' outputs. None where it does not apply."""
        bound = self.bound.get((index, size))
        addresses = bound.input_addresses() if bound is not None else None
        if not addresses or set(addresses) != set(parts[0]):
            return None
        jobs: dict[int, list] = {}  # per copy kind: (place in the bound device input, pieces)
        for name, address in addresses.items():
            at = address
            for part in parts:  # each part by its own kind: a hybrid decoder's batch is partly on each side
                value = part[name]
                address_on_device = device_address(value)
                if address_on_device is not None:  # e.g. a GPU decoder's rows: device to device
                    kind, piece = DEVICE_TO_DEVICE, address_on_device
                elif (isinstance(value, np.ndarray) and value.flags.c_contiguous and value.dtype != np.dtype(object)
                      and is_pinned(value.ctypes.data, value.nbytes)):
                    kind, piece = HOST_TO_DEVICE, (value.ctypes.data, value.nbytes)
                else:
                    return None
                pieces = jobs.setdefault(kind, [])
                if pieces and pieces[-1][2] == at:  # right after this kind's last piece: the same job
                    pieces[-1][1].append(piece)
                    pieces[-1][2] = at + piece[1]
                else:
                    pieces.append([at, [piece], at + piece[1]])
                at += piece[1]
        jobs = {kind: [(start, pieces) for start, pieces, _ in found] for kind, found in jobs.items()}
        start = time.perf_counter()
        try:
            for kind, copies in jobs.items():
                self.copiers[index].copy(copies, kind=kind)
        except RuntimeError as exc:  # the host join still works: use it from now on, and say why
            self.copiers[index].close()
            self.copiers[index] = None
            self.direct_copy_note = f"direct copies to the GPU failed ({exc}); batches are joined on the host"
            logger.warning("'%s', instance %d: %s", self.name, index, self.direct_copy_note)
            return None
        outputs, seconds = self._replay(index, bound, start)
        return real_rows(outputs, rows, size), seconds

    def _execute(self, index: int, feeds: Mapping[str, np.ndarray], *, in_turn: bool = True
                 ) -> tuple[dict[str, np.ndarray], float]:
        """Run ``feeds`` on instance ``index`` (its session for their size): the outputs and the seconds. Where
        runs take turns, the run waits for its turn unless ``in_turn`` is False (a warm-up: it must not hold
        back the instances in service); a size first met here binds and captures outside the turn."""
        runner = self.runners[index]
        size = next(iter(feeds.values())).shape[0] if feeds else 0
        if self.sessions and feeds:
            runner = self.sessions[index].get(size, runner)
        start = time.perf_counter()
        if self.graph:
            bound = self.bound.get((index, size))
            if bound is None:  # a size warm_up never ran: bind, and run until ONNX Runtime has captured
                bound = self.bound[(index, size)] = runner.bind(feeds, fixed_outputs=self._output_shapes(size))
                for _ in range(GRAPH_WARM_RUNS):
                    bound.run()
            bound.update(feeds)
            return self._replay(index, bound, start)
        run = functools.partial(runner.run_unchecked, feeds)  # checked by the pool's caller
        outputs, waited = self.turns.run(run) if in_turn else (run(), 0.0)
        seconds = time.perf_counter() - start
        self.phases[index] = {"run": seconds - waited, **self.turns.phase(waited)}
        return outputs, seconds

    def _replay(self, index: int, bound, start: float) -> tuple[dict[str, np.ndarray], float]:
        """Replay ``bound`` once its inputs were copied in (since ``start``): the outputs and the seconds since
        ``start``, with the phases (copy_in, replay, copy_out, and turn where runs take turns) recorded."""
        copied = time.perf_counter()
        _, waited = self.turns.run(bound.run)
        replayed = time.perf_counter()
        outputs = bound.outputs()
        end = time.perf_counter()
        self.phases[index] = {"copy_in": copied - start, "replay": replayed - copied - waited,
                              "copy_out": end - replayed, **self.turns.phase(waited)}
        return outputs, end - start

    def _output_shapes(self, size: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Each output's shape and dtype at batch ``size``: a captured graph has fixed shapes, so every axis but
        the batch axis must be fixed in the model."""
        shapes = {}
        for spec in self.model.outputs:
            rest = spec.shape[1:] if spec.shape else None
            if rest is None or not all(isinstance(d, int) for d in rest):
                raise ValueError(f"output '{spec.name}' has shape {spec.shape_text()}: graph capture needs every axis "
                                 "but the batch axis fixed")
            shapes[spec.name] = ((size, *rest), np.dtype(spec.dtype))
        return shapes

    def buffer(self, index: int, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        """Instance ``index``'s reused (page-locked where possible) buffer for input ``name``; strings get a
        fresh array (object arrays hold references, not bytes a device can copy)."""
        if np.dtype(dtype) == np.dtype(object):
            return np.empty(shape, dtype=dtype)
        host = self.hosts[index]
        if host is None:
            keep = max(16, 2 * len(self.model.inputs))
            host = self.hosts[index] = HostMemory(self._runtime, keep=keep, device_id=self._device_id)
        return host.buffer(name, shape, dtype)

    # -- activation ---------------------------------------------------------------------------------------

    def warm_up(self, sizes: Sequence[int] | None = None) -> list[int]:
        """Run each of ``sizes`` (default: every bucket size) once on every instance, in the instances' threads and
        side by side, so no real run pays for a kernel search or a capture (captures hold the gate exclusively,
        one at a time). The sizes warmed."""
        self._shrink_arenas([r for sizes in self.sessions for r in sizes.values()])
        for size in sorted(self.buckets if sizes is None else sizes, reverse=True):  # largest first: one buffer
            futures = [self.submit(index, self._warm, index, size) for index in range(len(self.runners))]
            errors = [f.exception() for f in futures]
            if any(errors):
                raise next(e for e in errors if e is not None)
        return sorted(self.buckets if sizes is None else sizes)

    def _warm(self, index: int, size: int) -> None:
        feeds = {}
        with self.gate.shared():  # page-locking is a CUDA call: never during another instance's capture
            for spec in self.model.inputs:
                trailing = self.model.input_shapes.get(spec.name, ())[1:]
                # From the instance's own buffers, so they are allocated (and pinned) before real work.
                feeds[spec.name] = self.buffer(index, spec.name, (size, *trailing), np.dtype(spec.dtype))
                feeds[spec.name][...] = 0
        if not self.graph:  # alone where asked (warm_turn), else shared: another model of the process may capture
            turn = self.warm_turn() if self.one_capture_at_a_time else self.gate.shared()
            with turn, startup.stage("first run", model=self.name, detail=f"b{size}"):
                self._execute(index, feeds, in_turn=False)
            return
        runner = self.sessions[index].get(size, self.runners[index]) if self.sessions else self.runners[index]
        with self.gate.exclusive():  # alone: ORT's first Run already captures (it runs again until captured)
            bound = runner.bind(feeds, fixed_outputs=self._output_shapes(size))
            with startup.stage("first run", model=self.name, detail=f"b{size}"):
                bound.run()  # kernel search, compile and the capture
            with startup.stage("graph capture", model=self.name, detail=f"b{size}"):
                for _ in range(GRAPH_WARM_RUNS - 1):  # replays (older runtimes capture on a later run)
                    bound.run()
        self.bound[(index, size)] = bound

    def _shrink_arenas(self, runners: Sequence[Runner]) -> None:
        """With ``arena_shrinkage`` (not under graphs: a captured graph keeps its memory), each runner once."""
        if not self.arena_shrinkage or self.graph:
            return
        for runner in runners:
            if id(runner) not in self._shrunk:
                self._shrunk.add(id(runner))
                runner.shrink_arenas()

    def close(self) -> None:
        """Wait for the instances' threads, release copiers, bindings, host buffers and (``owns``) runners."""
        for thread in self.threads:
            thread.shutdown(wait=True)
        for copier in self.copiers:
            if copier is not None:
                copier.close()
        self.bound.clear()
        for host in self.hosts:  # before the sessions: nothing runs on the buffers any more
            if host is not None:
                host.close()
        if not self.owns:
            return
        closed = set()
        for runner in [*self.runners, *(r for sizes in self.sessions for r in sizes.values())]:
            if id(runner) not in closed:
                closed.add(id(runner))
                runner.close()


# -- the process's GPU runtime, for callers outside engines ------------------------------------------------

def set_gpu_wait(target: Target, mode: str) -> str:
    """Make this process's threads wait for ``target``'s GPU by spinning, yielding or blocking (before the
    device is first used; engines/hostmem.py ``set_gpu_wait``). '' when set or not a GPU target, else why not."""
    runtime = runtime_for(target.device) if target.is_gpu else None
    if runtime is None:
        return ""
    return _set_gpu_wait(runtime, target.device_id or 0, mode)


def pin_for_copies(target: Target, address: int, nbytes: int) -> str:
    """Page-lock memory the caller owns (e.g. a shared-memory arena) with ``target``'s GPU runtime, so pools
    with graphs copy parts from it straight into their bound inputs. '' when pinned, else why not. Holds the
    capture gate shared: no CUDA call of ours during a capture. Undo with :func:`unpin_for_copies`."""
    runtime = runtime_for(target.device) if target.is_gpu else None
    with CAPTURE_GATE.shared():
        return pin(runtime, address, nbytes, target.device_id or 0)


def unpin_for_copies(target: Target, address: int) -> None:
    """Undo :func:`pin_for_copies` for the range starting at ``address`` (holding the capture gate shared)."""
    runtime = runtime_for(target.device)
    if runtime is None:
        return
    with CAPTURE_GATE.shared():
        unpin(runtime, address, target.device_id or 0)
