"""A served model: its signature (serve/signature.py: request validation, model metadata, Triton's config) and
its batching and padding policy. Its runs go through an :class:`onnxaccel.engines.pool.RunnerPool` (threads, a
session per padded size, bound and page-locked buffers, graph capture).

A model batches dynamically when every input and every output has a variable first axis (a dim_param or
unknown, as exporters write a dynamic batch): requests are then joined along axis 0 and the outputs split
back by the same row counts. A model with a fixed first axis runs each request as sent.

Other dynamic axes (a sequence length, an image's height and width): without shape buckets each request runs at
its own shape and joins only requests of the same shape (the batcher's key is the trailing shape). With
``shape_buckets`` (engines/buckets.py) each request is padded to the smallest bucket that fits (:meth:`fit`),
so requests of one bucket join, and its outputs are cropped back (:meth:`crop`); every bucket is run once at
load (:meth:`warm_buckets`) so no request pays for a compile or a kernel search.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.engines import Runner
from onnxaccel.engines.buckets import ShapeBuckets
from onnxaccel.engines.hostmem import DeviceStream
from onnxaccel.engines.pool import RunnerPool
from onnxaccel.errors import InputError
from onnxaccel.model import Model
from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.images import image_input_of
from onnxaccel.serve.protocol import InferRequest, bad_request
from onnxaccel.serve.signature import ModelSignature
from onnxaccel.plan import ExecutionPlan, has_batch_axis


@dataclass
class ModelInstance:
    """One served model: its signature, its runner pool, and the padding policy the batcher asks about.

    Built by :meth:`start` (each instance built in its own thread), or from compiled ``runners`` (and
    ``size_runners``, a session per padded size, which may be filled until ``warm_up``)."""

    config: ModelConfig
    model: Model
    runners: list[Runner]
    warnings: list[str] = field(default_factory=list)
    load_seconds: float = 0.0
    #: Per instance, a session per padded batch size; empty: one session.
    size_runners: list[dict[int, Runner]] = field(default_factory=list)
    pool: RunnerPool | None = None
    #: Sizes of the model's symbolic dims each request is padded up to (None: requests run at their shapes).
    shape_buckets: ShapeBuckets | None = None
    #: Per bucket label, the seconds its warm-up runs took (compile or kernel search included).
    bucket_warm_s: dict[str, float] = field(default_factory=dict)
    #: What runs (plan.py): padded sizes and graph capture come from it. None: planned here from the config.
    plan: ExecutionPlan | None = None
    #: The device stream every instance's session runs on (plan streams=shared; engines/hostmem.py DeviceStream),
    #: closed after the sessions; None: each session has its provider's own.
    stream: DeviceStream | None = None

    def __post_init__(self) -> None:
        self.batching = has_batch_axis(self.model) and self.config.max_batch > 1
        if self.plan is None:
            self.plan = self.config.plan(self.model)
        self.signature = ModelSignature(self.config, list(self.model.inputs), list(self.model.outputs),
                                        self.batching, self.plan.target.is_gpu,
                                        image_input_of(self.model, self.config.preprocess))
        if self.pool is None:
            self.pool = RunnerPool(self.runners, **self._pool_settings(self.config, self.model, self.plan),
                                   sessions=self.size_runners)

    @staticmethod
    def _pool_settings(config: ModelConfig, model: Model, plan: ExecutionPlan) -> dict:
        """The plan's padded sizes, graph capture, arena shrinkage and whether runs take turns (plan.py decides
        all four)."""
        return {"model": model, "buckets": plan.batch_sizes, "graph": plan.graph_capture,
                "arena_shrinkage": plan.arena_shrinkage, "name": config.name,
                "one_run_at_a_time": plan.streams == "serial"}

    @classmethod
    def start(cls, config: ModelConfig, model: Model, plan: ExecutionPlan, make: Callable[[], Runner],
              warnings: Sequence[str] = ()) -> ModelInstance:
        """``config.instances`` instances, each runner made by ``make()`` in the thread that runs it (and, on
        GPUs with ``session_per_batch_size``, one runner per padded size). ONNX Runtime's CUDA convolutions keep
        the cuDNN plan of the last input shape only (MIGraphX likewise recompiles on a new shape): a session that
        sees batches of 8 and 16 in turn rebuilds its plans on every run (docs/BENCHMARKS.md gives the cost), so
        each padded size gets a session, at the cost of one copy of the weights per size. Warm it up with :meth:`warm_up`."""
        started = time.perf_counter()
        settings = cls._pool_settings(config, model, plan)
        pool = RunnerPool.build(make, max(1, config.instances), session_per_bucket=config.session_per_batch_size,
                                warm_now=plan.warm_at_load or None, at_load=plan.instances_at_load, **settings)
        return cls(config, model, pool.runners, list(warnings), time.perf_counter() - started, pool.sessions, pool,
                   plan=plan)

    # -- what the batcher and the protocol ask ------------------------------------------------------------

    @property
    def buckets(self) -> tuple[int, ...]:
        """The padded batch sizes (empty: batches run as joined)."""
        return self.pool.buckets

    @buckets.setter
    def buckets(self, sizes: Sequence[int]) -> None:
        """Set the padded batch sizes."""
        self.pool.buckets = tuple(sizes)

    @property
    def graph(self) -> bool:
        """Whether the instances replay captured graphs."""
        return self.pool.graph

    @property
    def threads(self) -> list:
        """Per instance, the thread its runs go to."""
        return self.pool.threads

    @property
    def phases(self) -> list[dict[str, float]]:
        """Per instance, the seconds of each phase of its last batch."""
        return self.pool.phases

    @property
    def max_batch(self) -> int:
        """See ModelSignature.max_batch."""
        return self.signature.max_batch

    def metadata(self) -> dict:
        """See ModelSignature.metadata."""
        return self.signature.metadata()

    def triton_config(self) -> dict:
        """See ModelSignature.triton_config."""
        return self.signature.triton_config()

    def validate(self, request: InferRequest) -> tuple[dict[str, np.ndarray], int]:
        """See ModelSignature.validate."""
        return self.signature.validate(request)

    def batch_key(self, feeds: Mapping[str, np.ndarray]) -> tuple:
        """See ModelSignature.batch_key."""
        return self.signature.batch_key(feeds)

    def execute(self, index: int, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """Run one request's feeds on instance ``index`` (in its thread); outputs and seconds."""
        return self.pool.run(index, feeds)

    def execute_joined(self, index: int, parts: list[Mapping[str, np.ndarray]]
                       ) -> tuple[dict[str, np.ndarray], float]:
        """Run requests joined along axis 0 on instance ``index`` (in its thread); the outputs of the real
        rows and the seconds."""
        return self.pool.run_rows(index, parts)

    def fit_rows(self, waiting: int) -> int:
        """How many of ``waiting`` rows the next batch should take: all (up to max_batch), unless the model runs
        in padded sizes and their padding would exceed ``max_padding`` of the batch; then the padded size below
        (17 waiting rows: 16, not 32 with 15 of padding; the row left over goes with the next batch)."""
        limit = min(waiting, self.max_batch) if self.batching else waiting
        if not self.buckets or limit >= self.max_batch:
            return limit
        padded = self.pool.bucket(limit)
        if padded - limit <= self.config.max_padding * padded:
            return limit
        return max((b for b in self.buckets if b <= limit), default=limit)

    def padding_share(self, rows: int) -> float:
        """The share of padding in a batch of ``rows`` run at its padded size (0 without padded sizes)."""
        padded = self.pool.bucket(rows)
        return (padded - rows) / padded if padded else 0.0

    def fit(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], tuple | None]:
        """``feeds`` padded to their shape bucket, and what :meth:`crop` needs to cut the outputs back (None
        without buckets). A request that fits no bucket is a 400 naming the buckets."""
        if self.shape_buckets is None:
            return feeds, None
        try:
            bucket, actual = self.shape_buckets.bucket_for(self.model, feeds)
        except InputError as exc:
            raise bad_request(f"Model '{self.config.name}': {exc.message} {exc.hint}".strip()) from None
        return self.shape_buckets.pad(self.model, feeds, bucket), (bucket, actual)

    def crop(self, outputs: dict[str, np.ndarray], fitted: tuple | None) -> dict[str, np.ndarray]:
        """One request's outputs cut back from its bucket to its own sizes (as they are without buckets)."""
        if fitted is None or self.shape_buckets is None:
            return outputs
        bucket, actual = fitted
        return self.shape_buckets.crop(self.model, outputs, bucket, actual)

    def warm_buckets(self) -> dict[str, float]:
        """Run every shape bucket once on every instance at every padded batch size (in the instances' threads),
        so the first request of a bucket pays no compile (MIGraphX, TensorRT) or kernel search (cuDNN); the
        seconds per bucket. Axes neither bucketed nor batch take the compile shapes' sizes."""
        if self.shape_buckets is None:
            return {}
        sizes = self.buckets or (1,)
        for bucket in self.shape_buckets.sizes:
            start = time.perf_counter()
            for size in sizes:
                feeds = self._bucket_feeds(bucket, size)
                for index in range(len(self.runners)):
                    self.pool.submit(index, self.pool.run, index, feeds).result()
            self.bucket_warm_s[self.shape_buckets.label(bucket)] = time.perf_counter() - start
        return dict(self.bucket_warm_s)

    def _bucket_feeds(self, bucket: Sequence[int], rows: int) -> dict[str, np.ndarray]:
        """Zero feeds at ``bucket`` with ``rows`` on the batch axis (zeros: an attention mask of no tokens)."""
        value = dict(zip(self.shape_buckets.dims, bucket))
        feeds = {}
        for spec in self.model.inputs:
            compiled = self.model.input_shapes.get(spec.name, ())
            shape = []
            for axis, dim in enumerate(spec.shape or ()):
                if isinstance(dim, int):
                    shape.append(dim)
                elif axis == 0 and self.batching:
                    shape.append(rows)
                elif f"{spec.name}:{axis}" in value or dim in value:
                    shape.append(int(value.get(f"{spec.name}:{axis}", value.get(dim))))
                else:
                    shape.append(int(compiled[axis]) if axis < len(compiled) else 1)
            feeds[spec.name] = np.zeros(shape, dtype=np.dtype(spec.dtype))
        return feeds

    def warm_up(self) -> list[int]:
        """Run the padded batch sizes the plan warms at load (``warm_at_load``) once on every instance, so no
        request pays for a kernel search; the others follow in the background (:meth:`warm_step`)."""
        return self.pool.warm_up()

    def warm_pending(self, index: int) -> bool:
        """Whether instance ``index`` still has a padded size to build and warm in the background (once every
        instance joined: a size is used only when warm on all of them)."""
        return self.pool.joining is None and self.pool.later is not None and self.pool.later.pending_for(index)

    @property
    def planned(self) -> int:
        """The instances planned (some may still be joining: :meth:`serves`)."""
        return self.pool.planned

    def serves(self, index: int) -> bool:
        """Whether instance ``index`` takes batches (built and warm)."""
        return self.pool.serves(index)

    def may_join(self, index: int) -> bool:
        """Whether instance ``index``, not serving yet, is still to join (False: joining stopped, see the log)."""
        return self.pool.may_join(index)

    def join_step(self, index: int) -> bool:
        """In instance ``index``'s thread: build and warm it when it is its turn (engines/pool.py join_step);
        False when it was not its turn yet."""
        return self.pool.join_step(index)

    def warm_step(self, index: int) -> bool:
        """In instance ``index``'s thread, while it has no batch: build and warm its next padded size (see
        engines/pool_warm.py); False when it had nothing to do now."""
        return self.pool.warm_step(index)

    def close(self) -> None:
        """Stop the run threads and release buffers and sessions (then the stream they shared, if any)."""
        self.pool.close()
        if self.stream is not None:
            self.stream.close()
            self.stream = None
