"""The throughput report of one `batch` run (schema ``onnxaccel.batch/1``)."""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEMA = "onnxaccel.batch/1"


@dataclass
class WorkerStats:
    """What one worker (the CLI's process, or one Ray actor) did."""

    name: str
    units: int = 0
    rows: int = 0
    read_s: float = 0.0
    run_s: float = 0.0

    def to_dict(self) -> dict:
        """JSON-ready form of the worker's totals, with its rows per second of run time."""
        return {"name": self.name, "units": self.units, "rows": self.rows, "read_s": self.read_s,
                "run_s": self.run_s, "rows_per_run_s": self.rows / self.run_s if self.run_s else None}


@dataclass
class BatchReport:
    """What a batch job did: rows and shards done, time split, per-worker figures and warnings."""
    model: str
    target: str
    runner: str  # "in-process" or "ray"
    input: dict
    output: str
    batch: int
    shards_total: int
    shards_done: int
    shards_skipped: int
    rows_total: int
    rows_done: int
    rows_skipped: int
    #: Seconds from the start of the run to its last shard written, model compile and cluster start included.
    wall_s: float
    #: Seconds before the first unit started running (cluster connect, actor start, model compile).
    startup_s: float
    workers: list[WorkerStats] = field(default_factory=list)
    ray: dict | None = None
    warnings: list[str] = field(default_factory=list)
    #: --shape-buckets text the rows were padded to (None: none).
    shape_buckets: str | None = None
    #: Bad inputs of the output folder's shards (this run's and those carried by shards finished before): one
    #: dict per (shard, file, reason, stage) with the rows it cost (0: a file refused before any row).
    errors: list[dict] = field(default_factory=list)
    #: Rows this run could not read (they have no output row).
    rows_failed: int = 0
    on_error: str = "skip"
    #: Seconds after the last unit's rows were written: closing the decoders (a DALI pipeline's teardown) and
    #: the sessions, the output's final checks. Like start-up, a cost per run, not per row.
    shutdown_s: float = 0.0
    #: In-process runs: the pipeline's stage times (scale/stages.py StageTimes.to_dict), None on Ray.
    stages: dict | None = None
    #: The preprocessing embedded in the model run (uint8 NHWC pixels fed), None if none.
    embedded: dict | None = None
    #: How images became tensors (ImagePreprocess.to_dict: preset, origin, parameters); None for other inputs.
    preprocess: dict | None = None
    #: What ran: the job's ExecutionPlan (plan.py ExecutionPlan.to_dict).
    plan: dict | None = None
    #: Where the time to the first rows computed went (startup.py Startup.to_dict): this process's stages (on
    #: Ray, the actors' sessions are not in it).
    startup: dict | None = None
    #: The input shapes that ran (scale/shape_groups.py): per row shape, the shapes fed (``shapes``: input ->
    #: dims, the batch axis as bound), the bucket they were padded to (``padded_to``, or None), shards and rows.
    #: Shards skipped as finished count too: the shapes are the job's, not only this run's.
    shapes: list[dict] = field(default_factory=list)

    @property
    def steady_s(self) -> float:
        """Wall time from the first unit to the last one written: start-up and shutdown left out (never zero, it
        divides)."""
        return max(1e-9, self.wall_s - self.startup_s - self.shutdown_s)

    @property
    def rows_per_s(self) -> float:
        """Rows per second once running (start-up and shutdown excluded): the figure that scales with workers."""
        return self.rows_done / self.steady_s if self.rows_done else 0.0

    @property
    def rows_per_s_wall(self) -> float:
        """Rows done per second of wall time, start-up included."""
        return self.rows_done / self.wall_s if self.wall_s > 0 and self.rows_done else 0.0

    def to_dict(self) -> dict:
        """JSON-ready report (schema ``SCHEMA``) for ``batch --json``."""
        return {
            "schema": SCHEMA, "model": self.model, "target": self.target, "runner": self.runner,
            "input": self.input, "output": self.output, "batch": self.batch,
            "shards": {"total": self.shards_total, "done": self.shards_done, "skipped": self.shards_skipped},
            "rows": {"total": self.rows_total, "done": self.rows_done, "skipped": self.rows_skipped,
                     "failed": self.rows_failed},
            "wall_s": self.wall_s, "startup_s": self.startup_s, "shutdown_s": self.shutdown_s,
            "rows_per_s": self.rows_per_s,
            "rows_per_s_wall": self.rows_per_s_wall, "workers": [w.to_dict() for w in self.workers],
            "ray": self.ray, "warnings": self.warnings, "shape_buckets": self.shape_buckets,
            "on_error": self.on_error, "errors": self.errors, "stages": self.stages, "embedded": self.embedded,
            "preprocess": self.preprocess, "plan": self.plan, "startup": self.startup, "shapes": self.shapes,
        }
