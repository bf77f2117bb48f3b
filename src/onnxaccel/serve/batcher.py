"""Dynamic batching: concurrent requests joined along the batch axis, run once, split back.

Like Triton's dynamic batcher (triton-inference-server/server docs/user_guide/model_configuration.md,
"Dynamic Batcher"): once a request is waiting, a worker gathers more requests with the same trailing shapes
until the batch holds ``max_batch`` rows or ``max_queue_delay`` has passed since the first one arrived, runs
the batch, and hands each request its rows. With the adaptive delay (the default) it waits only while another
request is on its way in (its body being read or decoded by this process's front end): with none, waiting
could not fill the batch, so a lone request runs at once instead of paying the delay (Triton's batcher
always waits; ``queue_delay: fixed`` does the same). With ``queue_delay: fill`` (several instances sharing one
device), a batch that is not full also waits while another instance's batch runs, until it is full or the
device has no batch running: a batch started beside a running one shares the device with it anyway, so it gains
little by starting early and loses rows it could have held. It holds only while enough requests are about for a
full batch to form beside the running one (``_can_fill``); with fewer it gathers as ``adaptive`` does. One worker
per model instance; runs happen in threads (ONNX Runtime releases the GIL in ``run``), so the event loop keeps
accepting requests meanwhile.

The queue is bounded (``max_queue`` requests): beyond it ``submit`` refuses at once with 429, so memory
stays bounded under overload instead of growing with the backlog.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.serve.instance import ModelInstance
from onnxaccel.serve.protocol import ProtocolError

logger = logging.getLogger(__name__)
#: Failed batches logged with their traceback per model; later ones are counted in the log line only.
LOGGED_FAILURES = 5
#: Seconds an idle instance waits before it looks again for a padded size to warm (another instance warming).
WARM_POLL_S = 0.05
#: ``fill``: how long a peak of requests about (DynamicBatcher._can_fill) counts.
FILL_WINDOW_S = 1.0


@dataclass
class BatchTiming:
    """What one request went through: seconds queued, seconds of the run it was part of, that run's rows."""

    queue_s: float
    compute_s: float
    batch_rows: int


@dataclass
class _Pending:
    feeds: dict[str, np.ndarray]
    rows: int
    key: tuple
    future: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)
    #: perf_counter() after which it leaves the queue unrun (503); None: it waits as long as it takes.
    deadline: float | None = None
    #: Its shape bucket and actual sizes, to crop its outputs back (ModelInstance.fit); None without buckets.
    fitted: tuple | None = None


class OnTheWay:
    """One request counted as on its way to a batcher (DynamicBatcher.expect) until ``release()`` (idempotent;
    also on leaving a ``with`` block). The last release wakes a batch that waits only for requests on their way."""

    __slots__ = ("_batcher",)

    def __init__(self, batcher: DynamicBatcher | object | None):
        self._batcher = batcher if getattr(batcher, "on_the_way", None) is not None else None
        if self._batcher is not None:
            self._batcher.on_the_way += 1

    def release(self) -> None:
        """No longer on its way (queued, or failed); the second and later calls do nothing."""
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher.on_the_way -= 1
            if batcher.on_the_way == 0 and hasattr(batcher, "_arrival"):  # a worker's RemoteBatcher has none
                batcher._arrival.set()

    def __enter__(self) -> OnTheWay:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class DynamicBatcher:
    """The queue and workers of one model."""

    def __init__(self, instance: ModelInstance, *, on_batch: Callable[[int, float, dict], None] | None = None,
                 sees_arrivals: bool = False, arrivals: Callable[[str], int] | None = None):
        self.instance = instance
        self.max_batch = max(1, instance.max_batch)
        self.delay_s = instance.config.max_queue_delay_ms / 1e3 if instance.batching else 0.0
        adaptive = instance.config.queue_delay in ("adaptive", "fill")
        #: Whether a batch that is not full waits while another instance's batch runs (``queue_delay: fill``).
        self.fill = instance.config.queue_delay == "fill"
        #: Requests for this model taken in by this process's front end and not queued yet (OnTheWay), counted
        #: where that front end is the only way in (``sees_arrivals``); None elsewhere.
        self.on_the_way: int | None = 0 if sees_arrivals and adaptive else None
        #: The model process of --shared-models: its workers' requests for a model taken in and not sent here
        #: yet (the counters of their arenas, serve/arena.py). Neither (Ray's replicas): the delay is always waited.
        self._arrivals = arrivals if adaptive else None
        self.max_queue = instance.config.max_queue
        self._queue: collections.deque[_Pending] = collections.deque()
        #: Rows queued per batch key, kept with the queue (so gathering does not rescan it per arrival).
        self._rows: collections.Counter[tuple] = collections.Counter()
        self._work = asyncio.Event()
        self._arrival = asyncio.Event()
        self._flush = False
        #: One batch forms at a time, as in Triton's scheduler: two idle instances would otherwise wait for the
        #: same first request, and the second would then take the first one's leftovers at once (batches of 1-2
        #: rows beside full ones). After one worker took its batch, the next gathers from the new first request.
        self._forming = asyncio.Lock()
        self._on_batch = on_batch
        #: Batches running now (taken and not yet split), and their rows.
        self.running = 0
        self.running_rows = 0
        #: A gathering batch holds for ``fill`` (waits for a running batch to end, or its rows to arrive).
        self._holding = False
        #: ``fill``: the most requests seen about at once (_can_fill) within about FILL_WINDOW_S, and when.
        self._peak, self._peak_at = 0, 0.0
        count = instance.planned  # instances still joining get a worker that joins them first
        self._workers = [asyncio.ensure_future(self._worker(i)) for i in range(count)]
        self.executions = 0
        self.failures = 0

    @property
    def queued(self) -> int:
        """Requests waiting to be batched."""
        return len(self._queue)

    async def submit(self, feeds: dict[str, np.ndarray], rows: int, timeout_s: float | None = None
                     ) -> tuple[dict[str, np.ndarray], BatchTiming]:
        """Queue one request; its outputs once its batch has run. Raises ProtocolError 429 when full, and
        503 when ``timeout_s`` passes while it still waits in the queue (once its batch runs, it finishes)."""
        return await self.enqueue(feeds, rows, timeout_s)

    def enqueue(self, feeds: dict[str, np.ndarray], rows: int, timeout_s: float | None = None) -> asyncio.Future:
        """``submit`` without a coroutine: the future of (outputs, timing). For callers that answer from a
        callback (the model process, serve/model_host.py), one task per request less."""
        if len(self._queue) >= self.max_queue:
            raise ProtocolError(429, f"Model '{self.instance.config.name}' has {len(self._queue)} requests "
                                f"waiting (max_queue {self.max_queue}); retry later.", retry_after=1)
        feeds, fitted = self.instance.fit(feeds)  # padded to its shape bucket (a 400 when none fits)
        future = asyncio.get_running_loop().create_future()
        key = self.instance.batch_key(feeds)
        pending = _Pending(feeds, rows, key, future, fitted=fitted)
        if timeout_s is not None:
            pending.deadline = pending.arrived + timeout_s
        self._queue.append(pending)
        self._rows[key] += rows
        self._work.set()
        # A gathering worker waits for a full batch, not each arrival; but where the requests on their way are
        # counted elsewhere (the model process), each arrival may be the last one on its way: it looks again.
        if self._rows[key] >= self.max_batch or self._arrivals is not None:
            self._arrival.set()
        return future

    def flush(self) -> None:
        """Stop waiting for batches to fill (shutdown): run what is queued now."""
        self._flush = True
        self._arrival.set()
        self._work.set()

    async def close(self) -> None:
        """Stop the batching tasks; requests still queued get a 503 (the model was unloaded)."""
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        for pending in self._queue:
            if not pending.future.done():
                pending.future.set_exception(ProtocolError(503, "The model was unloaded."))
        self._queue.clear()
        self._rows.clear()

    # -- workers ---------------------------------------------------------------------------------------

    async def _worker(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.instance.serves(index):  # built and warmed after ready, one at a time, then it serves
                if not self.instance.may_join(index):
                    return  # joining stopped (logged): the instances in service serve on
                if not await loop.run_in_executor(self.instance.threads[index], self.instance.join_step, index):
                    await asyncio.sleep(WARM_POLL_S)  # an earlier instance is joining
                else:  # idle workers wait for work: wake them to look at the sizes left to warm (after joins)
                    self._work.set()
                continue
            if self.instance.warm_pending(index):  # idle time first warms the sizes left for after ready
                try:
                    if not self._work.is_set() and await loop.run_in_executor(
                            self.instance.threads[index], self.instance.warm_step, index):
                        continue
                except Exception:  # noqa: BLE001 - the warm sizes serve on; nothing more is warmed
                    logger.exception("model '%s': warming padded sizes after ready stopped",
                                     self.instance.config.name)
                    self.instance.pool.later = None
                    continue
                with contextlib.suppress(asyncio.TimeoutError):  # another instance warms: look again soon
                    await asyncio.wait_for(self._work.wait(), WARM_POLL_S)
                if not self._work.is_set():
                    continue
            await self._work.wait()
            async with self._forming:
                self._drop_abandoned()
                if not self._queue:
                    self._work.clear()
                    continue
                if self.instance.batching and (self.delay_s > 0 or self.fill):
                    await self._gather(self._queue[0])
                batch = self._take()
                rows = sum(p.rows for p in batch)
                if batch:  # counted before the next worker may gather (it holds only while this one runs)
                    self.running += 1
                    self.running_rows += rows
            if not batch:
                continue
            try:
                outputs, seconds = await loop.run_in_executor(self.instance.threads[index], self._run, index, batch)
                results = self._split(batch, outputs)  # here, not in the run thread: see _run
            except asyncio.CancelledError:
                self._ran(rows)
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(ProtocolError(503, "The model was unloaded."))
                raise
            except Exception as exc:  # noqa: BLE001 - every waiting request gets the failure
                self._ran(rows)
                error = exc if isinstance(exc, ProtocolError) else ProtocolError(
                    500, f"Inference failed on model '{self.instance.config.name}': {exc}")
                self.failures += 1
                if self.failures <= LOGGED_FAILURES:  # the server's log says why (a few times, not a flood)
                    logger.error("model '%s': a batch of %d request(s) failed (%d so far): %s",
                                 self.instance.config.name, len(batch), self.failures, error.message,
                                 exc_info=not isinstance(exc, ProtocolError))
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(error)
                continue
            self._ran(rows)
            self.executions += 1
            if self._on_batch is not None:
                self._on_batch(rows, seconds, self.instance.phases[index])
            now = time.perf_counter()
            for pending, result in zip(batch, results):
                if not pending.future.done():
                    timing = BatchTiming(now - pending.arrived - seconds, seconds, rows)
                    pending.future.set_result((result, timing))

    def _ran(self, rows: int) -> None:
        """A batch of ``rows`` has run (or failed): a batch held for this one (``fill``) looks again."""
        self.running -= 1
        self.running_rows -= rows
        # Only a batch held for fill is woken: one gathering as adaptive does waits for arrivals alone (woken
        # here, it could leave before a request already in the model process's link is queued).
        if self._holding:
            self._arrival.set()

    def expect(self) -> OnTheWay:
        """A request for this model is on its way (its body being read or decoded): release() once it is queued
        or has failed. An adaptive delay waits only while some request is on its way."""
        return OnTheWay(self)

    async def _gather(self, first: _Pending) -> None:
        deadline = first.arrived + self.delay_s
        adaptive = self.adaptive
        if adaptive:
            await asyncio.sleep(0)  # requests read in the same turn of the event loop are queued first
        while not self._flush and self._rows_for(first.key) < self.max_batch:
            if self.fill and self.running and self._can_fill(first.key):
                # another batch occupies the device and enough requests are about for a full one to form beside
                # it: hold until full or it is done
                self._arrival.clear()
                self._holding = True
                try:
                    await self._arrival.wait()
                finally:
                    self._holding = False
                continue
            if adaptive and not self._on_their_way():
                return  # no other request is on its way: waiting could not fill the batch, so it runs now
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._arrival.clear()
            try:
                await asyncio.wait_for(self._arrival.wait(), remaining)
            except asyncio.TimeoutError:
                return

    @property
    def adaptive(self) -> bool:
        """Whether a batch waits only while requests are on their way (else the whole delay)."""
        return self.on_the_way is not None or self._arrivals is not None

    def _on_their_way(self) -> int:
        return (self.on_the_way or 0) + (self._arrivals(self.instance.config.name) if self._arrivals else 0)

    def _can_fill(self, key: tuple) -> bool:
        """``fill`` holds a batch beside a running one only where enough clients send for a full batch to form
        while the other runs: the requests in this process (the running batches' rows, the queued rows, the
        requests on their way) numbered at least twice max batch at some check within the last FILL_WINDOW_S.
        With fewer clients (64 at max batch 64) holding could only wait for the running batch to end, one batch at
        a time, and the device would idle between them: it then gathers as ``adaptive`` does. A recent peak, not
        the count of the moment: when a batch ends its clients are on their way back, out of every count, so the
        count dips exactly when the next batch gathers (docs/SERVING.md, "Dynamic batching", has the
        measurements)."""
        now, about = time.perf_counter(), self.running_rows + self._rows[key] + self._on_their_way()
        if about >= self._peak or now - self._peak_at > FILL_WINDOW_S:
            self._peak, self._peak_at = about, now
        return self._peak >= 2 * self.max_batch

    def _rows_for(self, key: tuple) -> int:
        return self._rows[key]

    def _recount(self) -> None:
        self._rows = collections.Counter()
        for pending in self._queue:
            self._rows[pending.key] += pending.rows

    def _drop_abandoned(self) -> None:
        """Leave out requests nobody waits for any more, and those past their deadline (answered 503)."""
        now = time.perf_counter()
        for pending in self._queue:
            if pending.deadline is not None and now > pending.deadline and not pending.future.done():
                pending.future.set_exception(ProtocolError(
                    503, f"Request to model '{self.instance.config.name}' timed out after "
                    f"{(now - pending.arrived) * 1e3:.0f} ms in the queue (the server is overloaded).",
                    retry_after=1))
        if any(p.future.done() for p in self._queue):
            self._queue = collections.deque(p for p in self._queue if not p.future.done())
            self._recount()

    def _take(self) -> list[_Pending]:
        """The oldest request plus the others of the same key that fit in max_batch rows; for models run in
        padded sizes, fewer where that cuts the padding share under max_padding (ModelInstance.fit_rows)."""
        self._drop_abandoned()
        if not self._queue:
            return []
        first = self._queue[0]
        batch = self._pack(first, self.max_batch)
        rows = sum(p.rows for p in batch)
        if self.instance.batching and self.instance.buckets:
            limit = max(first.rows, self.instance.fit_rows(rows))
            if limit < rows:  # keep the cut only where the requests packed under it are padded less
                cut = self._pack(first, limit)
                cut_rows = sum(p.rows for p in cut)
                if self.instance.padding_share(cut_rows) < self.instance.padding_share(rows):
                    batch, rows = cut, cut_rows
        taken = {id(p) for p in batch}
        self._queue = collections.deque(p for p in self._queue if id(p) not in taken)
        self._rows[first.key] -= rows
        if not self._queue:
            self._work.clear()
        return batch

    def _pack(self, first: _Pending, limit: int) -> list[_Pending]:
        """``first`` and, in queue order, the requests of its key that still fit under ``limit`` rows."""
        batch, rows = [first], first.rows
        if not self.instance.batching:
            return batch
        for pending in self._queue:
            if pending is not first and pending.key == first.key and rows + pending.rows <= limit:
                batch.append(pending)
                rows += pending.rows
        return batch

    def _run(self, index: int, batch: list[_Pending]) -> tuple[dict[str, np.ndarray], float]:
        """In a pool thread: join and run once. Nothing else: the event loop thread holds the GIL most of
        the time, and every Python step here may wait for it (the split happens back on the loop)."""
        if len(batch) == 1:
            return self.instance.execute(index, batch[0].feeds)
        return self.instance.execute_joined(index, [p.feeds for p in batch])

    def _split(self, batch: list[_Pending], outputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Each request's rows of the joined outputs (views, no copies), in batch order, cropped back from its
        shape bucket."""
        crop = self.instance.crop
        if len(batch) == 1:
            return [crop(outputs, batch[0].fitted)]
        total = sum(p.rows for p in batch)
        bounds = np.cumsum([p.rows for p in batch])[:-1]
        for name, value in outputs.items():
            if value.ndim == 0 or value.shape[0] != total:
                raise ProtocolError(500, f"Output '{name}' of model '{self.instance.config.name}' has shape "
                                    f"{list(value.shape)}, not {total} rows: its first axis is not the batch; "
                                    "serve it with max_batch 1.")
        split = {n: np.split(v, bounds, axis=0) for n, v in outputs.items()}
        return [crop({n: split[n][i] for n in outputs}, p.fitted) for i, p in enumerate(batch)]
