"""`bench --shape-buckets` and `--shape-sweep`: a model run through shape buckets (engines/buckets.py), measured
per bucket: compile seconds (the session built at the bucket's bound shapes), warm-up seconds (its first run:
kernel builds, cuDNN algorithm search) and latency of feeds padded to it.

Without ``sweep`` one row: the feeds of the given ``--shape``/``--input`` size, padded to the bucket they fit
(the latency a user with that length pays: pad, run, crop). With ``sweep`` one row per bucket, fed at the
bucket's own size. Latency is timed on host arrays (``run``: padding and cropping included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.bench.host import environment, utc_now
from onnxaccel.bench.timing import TimingResult, measure_call
from onnxaccel.engines.buckets import BucketedRunner, ShapeBuckets
from onnxaccel.inputs import prepare_feeds
from onnxaccel.model import Model, load_model
from onnxaccel.pipeline import ConvertedModel, RunnerFromVariant
from onnxaccel.target import Target
from onnxaccel.transform.compile_cache import bucket_cache_keys, cache_kind

SCHEMA = "onnxaccel.bucket-bench/1"


@dataclass
class BucketRow:
    """One measured feed size: the bucket it ran in, that bucket's compile and warm-up seconds, its latency."""

    bucket: str
    feed: dict[str, int]
    compile_seconds: float
    warm_seconds: float | None
    timing: TimingResult
    #: The compile-cache entry digest of the bucket's program (targets with a compile cache), else None.
    cache_digest: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready values (latency in milliseconds)."""
        return {"bucket": self.bucket, "feed": self.feed, "compile_seconds": self.compile_seconds,
                "warm_seconds": self.warm_seconds, "cache_digest": self.cache_digest, **self.timing.to_dict()}


@dataclass
class BucketBench:
    """Every row of a bucket bench, with the model, target and buckets they ran under."""

    model: str
    target: str
    buckets: ShapeBuckets
    sweep: bool
    per_bucket_sessions: bool
    rows: list[BucketRow] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    environment: dict = field(default_factory=dict)
    created: str = ""

    def to_dict(self) -> dict:
        """JSON-ready form, schema :data:`SCHEMA`."""
        return {"schema": SCHEMA, "created": self.created, "model": self.model, "target": self.target,
                "shape_buckets": self.buckets.to_dict(), "shape_sweep": self.sweep,
                "per_bucket_sessions": self.per_bucket_sessions, "rows": [r.to_dict() for r in self.rows],
                "warnings": self.warnings, "environment": self.environment}


def bench_buckets(source: str | Model, target: Target, buckets: ShapeBuckets, *, sweep: bool = False,
                  shapes: Mapping[str, Sequence[int]] | None = None, batch: int | None = None,
                  inputs: Sequence[str] = (), seed: int = 0,
                  value_ranges: Mapping[str, tuple[float, float]] | None = None, warmup: int = 10,
                  runs: int | None = 100, duration: float | None = None, strict: bool = False) -> BucketBench:
    """Compile ``source`` per bucket for ``target`` (or once, where the target does not compile per shape),
    warm every bucket, and time the feeds: the given size (``sweep`` False) or each bucket's size."""
    model = source if isinstance(source, Model) else load_model(source)
    buckets.validate(model)

    def compile(bound: Model):
        return RunnerFromVariant(ConvertedModel(bound, target), strict=strict)()

    runner = BucketedRunner(model, target, buckets, compile, batch=batch, shapes=_unbucketed(shapes, buckets))
    try:
        runner.warm_up()
        digests = _digests(model, target, buckets, batch)
        result = BucketBench(model.source, str(target), buckets, sweep, runner.per_bucket,
                             warnings=list(runner.warnings), environment=environment(), created=utc_now())
        for feeds in _feed_sets(model, buckets, sweep, shapes, batch, inputs, seed, value_ranges):
            bucket, actual = buckets.bucket_for(runner.model, feeds)
            stats = runner.stats[bucket]
            items = int(np.shape(next(iter(feeds.values())))[0]) if feeds else 1
            timing = measure_call(lambda f=feeds: runner.run(f), batch=items, warmup=warmup, runs=runs,
                                  duration=duration, iobinding=False)
            result.rows.append(BucketRow(stats.label, actual, stats.compile_seconds, stats.warm_seconds, timing,
                                         digests.get(stats.label)))
        return result
    finally:
        runner.close()


def _feed_sets(model: Model, buckets: ShapeBuckets, sweep: bool, shapes, batch, inputs, seed, value_ranges):
    """The feeds to time: the given size once, or one set per bucket at its size."""
    if not sweep:
        yield prepare_feeds(model, inputs, shapes=shapes, batch=batch, seed=seed, value_ranges=value_ranges).feeds
        return
    for bucket in buckets.sizes:
        at = {**dict(shapes or {}), **buckets.bindings_for(model, bucket)}
        yield prepare_feeds(model, inputs, shapes=at, batch=batch, seed=seed, value_ranges=value_ranges).feeds


def _unbucketed(shapes: Mapping[str, Sequence[int]] | None, buckets: ShapeBuckets) -> dict | None:
    """The --shape bindings of dims no bucket names (the buckets bind their own)."""
    return {k: v for k, v in (shapes or {}).items() if k not in buckets.dims} or None


def _digests(model: Model, target: Target, buckets: ShapeBuckets, batch: int | None) -> dict[str, str]:
    """Per bucket label, the compile-cache digest its program is keyed by (empty without a cache)."""
    if cache_kind(target) is None:
        return {}
    return {label: key.digest for label, key in bucket_cache_keys(model, target, buckets, batch=batch).items()}


def bucket_table_rows(result: BucketBench) -> list[list[str]]:
    """The rows of the terminal table: bucket, feed, compile s, warm ms, p50 ms, p99 ms, items/s (<= 80
    columns for buckets of up to two dims)."""
    rows = []
    for row in result.rows:
        lat = row.timing.latency
        feed = ",".join(f"{v}" for v in row.feed.values()) or "-"
        warm = f"{1e3 * row.warm_seconds:.1f}" if row.warm_seconds is not None else "-"
        rows.append([row.bucket, feed, f"{row.compile_seconds:.2f}", warm, f"{lat.p50:.3f}", f"{lat.p99:.3f}",
                     f"{row.timing.throughput:,.1f}"])
    return rows
