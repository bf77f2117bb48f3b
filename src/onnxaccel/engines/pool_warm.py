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
  to run, builds and warms the next one (smallest first). A size is used once it is warm on every instance.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

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

    def to_dict(self) -> dict:
        """JSON-ready: the sizes still warming and those that failed, with why."""
        with self._lock:
            return {"pending": list(self.sizes), "failed": {str(k): v for k, v in self.failed.items()}}
