"""Building and warming a :class:`~onnxaccel.engines.pool.RunnerPool`'s instances: in parallel, and the padded
sizes a server does not need before it is ready later, in the background.

Start-up of a GPU server is mostly first runs (ONNX Runtime's CUDA EP searches and compiles its kernels on a
session's first run: seconds for a ResNet-50 at batch 64) and session creation, once per instance and padded size.
Done one after the other that was 4 instances x 7 sizes = 28 sessions and 28 first runs before the server said
ready. Here:

* instances are made side by side, each in its own thread (the first one alone, so caches it writes, a converted
  variant or a compiled engine, are written once and read by the others);
* first runs go side by side too (holding the process's capture gate shared), except where the pool captures
  graphs: ONNX Runtime captures during a session's first Run already, and a capture fails if another thread
  makes a CUDA call meanwhile (engines/pool_io.py CaptureGate), so those hold the gate alone, one at a time;
* a server warms only the sizes its plan names in ``warm_at_load`` (plan_sizes.py: the largest, which every batch
  fits padded) before it is ready; :class:`WarmLater` keeps the others, and each instance, while it has nothing
  to run, builds and warms the next one (smallest first). A size is used once it is warm on every instance;
* a server builds and warms only the instances its plan names in ``instances_at_load`` (plan_sizes.py: one on a
  GPU) before it is ready; :class:`JoinLater` keeps the others, which are built and warmed one at a time, in
  order, in their own threads while the first ones serve, and each takes requests once warm at every size in use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from onnxaccel import startup
from onnxaccel.engines.base import Runner

logger = logging.getLogger(__name__)


def make_instances(make: Callable[[], Runner], threads: Sequence[ThreadPoolExecutor], sizes: tuple[int, ...]
                   ) -> list[dict[int | None, Runner]]:
    """Per thread, its instance's runner (key None) and a runner per further size in ``sizes``, each made by
    ``make()`` in that thread: the first instance alone, then the others side by side. Everything made is closed
    again if one fails."""
    built: list[dict[int | None, Runner]] = []
    futures = []
    error: BaseException | None = None
    try:
        built.append(threads[0].submit(_make_instance, make, sizes).result())
        futures = [thread.submit(_make_instance, make, sizes) for thread in threads[1:]]
    except BaseException as exc:  # noqa: BLE001 - closed below, then raised
        error = exc
    for future in futures:  # every one, so none is left running while the others are closed
        try:
            built.append(future.result())
        except BaseException as exc:  # noqa: BLE001
            error = error or exc
    if error is not None:
        for instance in built:
            for runner in instance.values():
                runner.close()
        raise error
    return built


def _make_instance(make: Callable[[], Runner], sizes: tuple[int, ...]) -> dict[int | None, Runner]:
    """In an instance's thread: its runner (key None) and, per further bucket size, a runner of its own."""
    made: dict[int | None, Runner] = {}
    try:
        made[None] = make()
        for size in sizes[1:]:
            made[size] = make()
    except BaseException:
        for runner in made.values():
            runner.close()
        raise
    return made


class JoinLater:
    """The instances a pool builds and warms after it went into service (see the module's docstring).

    ``make``: makes a runner (in the joining instance's thread); ``sizes``: the padded sizes that get a session of
    their own (empty: one runner per instance). ``stopped``: why no further instance joins (one failed to build or
    warm, or the work ended), '' while they do. The pool keeps each joined instance's seconds (``joined_s``).
    """

    def __init__(self, make: Callable[[], Runner], sizes: tuple[int, ...]) -> None:
        self.make = make
        self.sizes = sizes
        self.stopped = ""

    def build(self) -> dict[int | None, Runner]:
        """In the joining instance's thread: its runner (key None) and a runner per further size."""
        return _make_instance(self.make, self.sizes)


class WarmLater:
    """The padded sizes a pool builds and warms after it went into service (see the module's docstring).

    ``sizes``: still to warm, smallest first. ``make``: makes a session per size (None: the instance's runner
    serves every size). ``busy_at_most``: instances that may warm at once, so one stays free for requests.
    """

    def __init__(self, sizes: Sequence[int], count: int, make: Callable[[], Runner] | None) -> None:
        self.sizes = sorted(sizes)
        self.count = count
        self.make = make
        self.busy_at_most = max(1, count - 1)
        self.warm_on: dict[int, set[int]] = {size: set() for size in self.sizes}
        self.failed: dict[int, str] = {}
        self._busy: set[int] = set()
        self._lock = threading.Lock()

    def next_for(self, index: int) -> int | None:
        """The size instance ``index`` should warm next (and mark it busy), or None: nothing left for it, or as
        many instances as may are warming already."""
        with self._lock:
            size = next((s for s in self.sizes if index not in self.warm_on[s]), None)
            if size is None or index in self._busy or len(self._busy) >= self.busy_at_most:
                return None
            self._busy.add(index)
            return size

    def pending_for(self, index: int) -> bool:
        """Whether instance ``index`` has a size left to warm."""
        with self._lock:
            return any(index not in self.warm_on[s] for s in self.sizes)

    def done(self, index: int, size: int, error: str = "") -> bool:
        """Instance ``index`` warmed ``size`` (or failed to: ``error``, and the size is dropped for every
        instance). True when ``size`` is now warm on every instance."""
        with self._lock:
            self._busy.discard(index)
            if size not in self.warm_on:  # dropped meanwhile: it failed on another instance
                return False
            if error:
                self.failed[size] = error
                self.sizes.remove(size)
                del self.warm_on[size]
                return False
            self.warm_on[size].add(index)
            if len(self.warm_on[size]) < self.count:
                return False
            self.sizes.remove(size)
            del self.warm_on[size]
            return True

    def shrink(self, count: int) -> list[int]:
        """Fewer instances than planned will serve (one failed to join): the sizes now warm on every one of them,
        which are used from now on."""
        with self._lock:
            self.count = count
            done = [size for size, on in self.warm_on.items() if len(on) >= count]
            for size in done:
                self.sizes.remove(size)
                del self.warm_on[size]
            return done

    def to_dict(self) -> dict:
        """JSON-ready: the sizes still warming and those that failed, with why."""
        with self._lock:
            return {"pending": list(self.sizes), "failed": {str(k): v for k, v in self.failed.items()}}


class WarmingLater:
    """What a :class:`~onnxaccel.engines.pool.RunnerPool` does after it went into service: warm the padded sizes
    left for later (:meth:`warm_step`) and join the instances left for later (:meth:`join_step`). A mixin of the
    pool, kept here with the rest of its warming; it uses the pool's ``later``, ``joining``, ``runners``,
    ``sessions``, ``buckets``, ``bound``, ``gate``, ``in_service``, ``planned``, ``_warm`` and
    ``_shrink_arenas``."""

    def warm_step(self, index: int) -> bool:
        """In instance ``index``'s thread, while it has nothing to run: build (with a session per size) and warm
        the next size of :attr:`later`; a size warm on every instance joins :attr:`buckets`. False when there was
        nothing for this instance to do now (done, or enough instances are warming)."""
        later = self.later
        size = later.next_for(index) if later is not None else None
        if size is None:
            return False
        runner = None
        try:
            if later.make is not None and size not in self.sessions[index]:
                with self.gate.shared(), startup.stage("session", model=self.name, detail=f"b{size} after ready"):
                    runner = later.make()
                self.sessions[index][size] = runner
                self._shrink_arenas([runner])
            self._warm(index, size)
        except Exception as exc:  # noqa: BLE001 - the size is not used; larger ones still serve its batches
            if runner is not None:
                self.sessions[index].pop(size, None)
                self.bound.pop((index, size), None)
                runner.close()
            later.done(index, size, str(exc))
            logger.warning("'%s': batch size %d could not be warmed on instance %d (%s); its batches run padded "
                           "to a larger size", self.name, size, index, exc)
            return True
        if later.done(index, size):
            self.buckets = tuple(sorted({*self.buckets, size}))
            logger.info("'%s': batch size %d warm on every instance, in use", self.name, size)
        return True

    def serves(self, index: int) -> bool:
        """Whether instance ``index`` takes work (it is built and warm)."""
        return index < self.in_service

    def may_join(self, index: int) -> bool:
        """Whether instance ``index``, not in service yet, is still to join (False: joining stopped)."""
        return self.joining is not None and not self.joining.stopped and index < self.planned

    def join_step(self, index: int) -> bool:
        """In instance ``index``'s thread: when it is its turn (instances join one at a time, in order), build it
        and warm it at every padded size in use, then it takes work. False when it was not its turn. A failure
        stops the joining (``joining.stopped`` says why; the instances in service serve on) and is logged."""
        joining = self.joining
        if joining is None or joining.stopped or index != self.in_service:
            return False
        started = time.perf_counter()
        made: dict[int | None, Runner] = {}
        try:
            with self.gate.shared(), startup.stage("session", model=self.name,
                                                   detail=f"instance {index} after ready"):
                made = joining.build()
            self.runners.append(made[None])  # reachable by _warm; takes work only once in_service counts it
            if joining.sizes:
                self.sessions.append({joining.sizes[0]: made[None], **{k: r for k, r in made.items() if k}})
            self._shrink_arenas(list(made.values()))
            for size in sorted(self.buckets, reverse=True):  # the sizes in use now, largest first
                self._warm(index, size)
        except Exception as exc:  # noqa: BLE001 - the instances in service serve on
            for key in [k for k in self.bound if k[0] == index]:
                del self.bound[key]
            del self.runners[index:]
            del self.sessions[index:]
            for runner in made.values():
                runner.close()
            joining.stopped = f"instance {index} could not be built or warmed: {exc}"
            if self.later is not None:  # sizes need warming on the instances in service only now
                self.buckets = tuple(sorted({*self.buckets, *self.later.shrink(self.in_service)}))
            logger.warning("'%s': %s; %d of %d instance(s) serve", self.name, joining.stopped, self.in_service,
                           self.planned)
            return True
        self.joined_s[index] = time.perf_counter() - started
        self.in_service += 1
        if self.in_service >= self.planned:
            self.joining = None
        logger.info("'%s': instance %d warm, in service (%d of %d, %.2f s)", self.name, index, self.in_service,
                    self.planned, self.joined_s[index])
        return True

    def join_in_background(self) -> list[Future]:
        """Build and warm the instances left to join, each in its own thread, one at a time and in order, with no
        batcher to drive them (batch jobs: the first instance runs units meanwhile). The futures, one per
        instance, done once it joined or joining stopped."""
        def join(index: int) -> None:
            while self.may_join(index) and not self.join_step(index):
                time.sleep(0.005)  # an earlier instance is joining

        return [self.submit(index, join, index) for index in range(self.in_service, self.planned)]

