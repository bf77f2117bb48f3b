"""The values a plan is made of and from: the host it is made for, what the user asked (:class:`PlanRequest`), and
each decision with its reason (:class:`Choice`). plan.py makes the plan; plan_sizes.py decides its batch sizes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from onnxaccel.target import Target


@dataclass(frozen=True)
class Host:
    """The facts of the machine a plan is made for."""

    cores: int

    @classmethod
    def here(cls) -> Host:
        """This machine."""
        return cls(cores=os.cpu_count() or 1)


@dataclass(frozen=True)
class Choice:
    """One decision of the plan: its name, its value and why."""

    name: str
    value: object
    reason: str
    #: The plan did not do what the user asked (e.g. graph capture dropped for this model): a note to show.
    overrides: bool = False

    def to_dict(self) -> dict:
        """JSON-ready form."""
        value = self.value
        if isinstance(value, Target):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        return {"name": self.name, "value": value, "reason": self.reason, "overrides": self.overrides}


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for, as given: None means "not given, the plan decides"."""

    command: str = "run"
    #: Rows per call (run, bench, batch); serve batches dynamically up to ``max_batch``.
    batch: int | None = None
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    shape_buckets: str | None = None
    instances: int | None = None
    max_batch: int | None = None
    max_padding: float | None = None
    session_per_batch_size: bool = True
    #: The image preset of host preprocessing (``--preprocess``), and whether to embed it: "auto" (embed on GPU
    #: targets), "none", or a preset to embed whatever the target.
    preprocess: str | None = None
    embed_preprocess: str | None = None
    #: What the input holds (batch): "images", "arrays", "table"; embedding is automatic only for images.
    input_kind: str | None = None
    workers: int | None = None
    shared_models: bool | None = None
    on_ray: bool = False
    gpu_wait: str | None = None
    gil_switch_ms: float | None = None
    arena_extend_strategy: str | None = None
    gpu_mem_limit: int | None = None
    arena_shrinkage: bool = False
    decoder: str | None = None
    #: serve: warm every padded size before ready (default: the largest first, the others in the background).
    warm_all_sizes: bool = False
    #: serve's batch-forming policy (``--queue-delay``): adaptive, fixed or fill; None lets the plan choose.
    queue_delay: str | None = None
    #: serve, a GPU model's instances: "shared" (their runs queue on one device stream), "serial" (one run at a
    #: time) or "own" (``--streams``); None lets the plan choose.
    streams: str | None = None
    #: Turn on the provider's graph capture where it has one and the plan allows it (serve's automatic layout
    #: does; an explicit ``enable_cuda_graph=0`` in the target always wins).
    auto_graph: bool | None = None

    def layout_given(self) -> bool:
        """Whether the user set any of serve's layout flags."""
        return self.processes_given() or self.instances is not None

    def processes_given(self) -> bool:
        """Whether the user set serve's process layout (``--workers``, ``--shared-models``): then it and graph
        capture are theirs. ``--instances`` alone keeps the chosen processes and capture, with that many
        sessions: a user tuning the session count should not lose the workers and the graphs with it."""
        return self.workers is not None or self.shared_models is not None
