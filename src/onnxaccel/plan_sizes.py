"""The batch sizes of a plan: the padded sizes a server runs at, the rows per call of ``batch``, which of the sizes
are warmed before a server says it is ready, and the model-shape predicates these decisions (and graph capture)
rest on. plan.py calls them; each appends its :class:`~onnxaccel.plan_types.Choice`."""

from __future__ import annotations

from onnxaccel.model import Model
from onnxaccel.plan_types import Choice, PlanRequest
from onnxaccel.target import Target

#: `batch`'s rows per call when neither the model nor the user fixes it.
DEFAULT_BATCH = {"cpu": 8}
DEFAULT_GPU_BATCH = 32


def has_batch_axis(model: Model) -> bool:
    """Whether every input and output has a variable first axis, so requests can be joined along it."""
    specs = list(model.inputs) + list(model.outputs)
    return bool(specs) and all(s.shape is not None and len(s.shape) >= 1 and not isinstance(s.shape[0], int)
                               for s in specs)


def fixed_shapes_but_batch(model: Model) -> bool:
    """A batch axis, and every other axis of every input and output fixed: what a captured graph, which replays
    one shape at fixed device addresses, needs when batches are padded to a few sizes."""
    specs = list(model.inputs) + list(model.outputs)
    return has_batch_axis(model) and all(all(isinstance(d, int) for d in s.shape[1:]) for s in specs)


def padded_sizes(max_batch: int) -> tuple[int, ...]:
    """The batch sizes a GPU server runs at: powers of two up to ``max_batch``, and ``max_batch`` itself. Every new
    input shape costs a kernel search on GPUs (cuDNN's algorithm search, a MIGraphX recompile), so batches are
    padded to a few sizes, each warmed once at load, as Triton's preferred batch sizes do."""
    sizes = {1, max_batch}
    size = 2
    while size < max_batch:
        sizes.add(size)
        size *= 2
    return tuple(sorted(sizes))


def batch_sizes_for(target: Target, request: PlanRequest, model: Model | None, choices: list[Choice]
                 ) -> tuple[int, ...]:
    """The batch sizes the plan runs at, with the choice and its reason appended to ``choices``: serve on a GPU pads
    batches to :func:`padded_sizes`; batch runs :func:`batch_size` rows per call; run and bench one size."""
    if request.command == "serve":
        max_batch = request.max_batch or 1
        if model is not None and not has_batch_axis(model):
            choices.append(Choice("batch_sizes", (), "the model has a fixed first axis: each request runs as sent"))
            return ()
        if max_batch <= 1 or not target.is_gpu:
            choices.append(Choice("batch_sizes", (), "CPU target: batches run as joined" if max_batch > 1 else
                                  "max_batch 1: no batching"))
            return ()
        sizes = padded_sizes(max_batch)
        choices.append(Choice("batch_sizes", sizes, "GPU target: batches padded to these sizes, each warmed at load "
                              f"(at most {request.max_padding if request.max_padding is not None else 0.25:g} of a "
                              "batch padding)" + ("; a session per size" if request.session_per_batch_size else "")))
        return sizes
    if request.command != "batch":  # run, bench...: the feeds bound the model; the plan records the size
        fixed = fixed_batch(model) if model is not None else None
        batch = request.batch or fixed or 1
        choices.append(Choice("batch", batch, "given" if request.batch is not None else "the bound model's"))
        return (batch,)
    batch = batch_size(target, request, model)
    choices.append(Choice("batch", batch, "given" if request.batch is not None else
                          "the model's fixed batch axis" if model is not None and fixed_batch(model) is not None
                          else f"default for {target.device}"))
    return (batch,)


def fixed_batch(model: Model) -> int | None:
    """The first input's batch axis when the model fixes it (an int), else None."""
    spec = model.inputs[0] if model.inputs else None
    return spec.shape[0] if spec is not None and spec.shape and isinstance(spec.shape[0], int) else None


def batch_size(target: Target, request: PlanRequest, model: Model | None) -> int:
    """Rows per call: the model's fixed batch axis, else the request's, else the device's default (batch)."""
    from onnxaccel.errors import UsageError

    fixed = fixed_batch(model) if model is not None else None
    batch = request.batch
    if fixed is not None:
        if batch is not None and batch != fixed:
            raise UsageError(f"The model's batch axis is fixed to {fixed}; --batch {batch} cannot apply.",
                             f"Drop --batch (it runs {fixed} row(s) per call), or export the model with a dynamic "
                             "batch axis.")
        return fixed
    if batch is not None:
        if batch < 1:
            raise UsageError(f"--batch must be at least 1, got {batch}.", "e.g. --batch 32")
        return batch
    return DEFAULT_BATCH.get(target.device, DEFAULT_GPU_BATCH)


def warm_at_load(request: PlanRequest, sizes: tuple[int, ...], choices: list[Choice]) -> tuple[int, ...]:
    """The padded sizes a server warms before it says it is ready: the largest (every batch fits it, padded), the
    others built and warmed in the background right after, each used once it is warm on every instance; all of
    them with ``warm_all_sizes``. Elsewhere (batch, run, bench) every size the plan has."""
    if request.command != "serve" or len(sizes) < 2:
        return sizes
    if request.warm_all_sizes or request.shape_buckets:
        choices.append(Choice("warm_at_load", sizes, "given (--warm-all-sizes): ready once every size is warm"
                              if request.warm_all_sizes else "shape buckets: every bucket at every size, at load"))
        return sizes
    choices.append(Choice("warm_at_load", sizes[-1:], f"the largest size first (every batch fits it): ready after "
                          f"it; {','.join(map(str, sizes[:-1]))} warm in the background, each used once warm"))
    return sizes[-1:]


def instances_at_load(target: Target, request: PlanRequest, instances: int, choices: list[Choice]) -> int:
    """The instances a server builds and warms before it says it is ready (a batch job, before it runs its first
    unit). On a GPU, an instance's first run
    takes seconds (the kernel search, a compile, the graph capture) and captures go one at a time, so a server
    is ready once its first instance is warm at the sizes it serves; the others are built and warmed one after
    another while it serves, each taking requests once warm (engines/pool_warm.py JoinLater). All of them with
    ``warm_all_sizes`` or shape buckets, on CPUs (a session is made in milliseconds) and elsewhere."""
    if request.command not in ("serve", "batch") or instances < 2 or not target.is_gpu:
        return instances
    if request.command == "batch":
        choices.append(Choice("instances_at_load", 1, "GPU target: the job starts on the first instance once it is "
                              "warm; the others are built and warmed while it runs, each taking units once warm"))
        return 1
    if request.warm_all_sizes or request.shape_buckets:
        choices.append(Choice("instances_at_load", instances, "given (--warm-all-sizes): ready once every instance "
                              "is warm" if request.warm_all_sizes else "shape buckets: every instance at load"))
        return instances
    more = f"the other {instances - 1} are" if instances > 2 else "the other is"
    choices.append(Choice("instances_at_load", 1, f"GPU target: ready once the first instance is warm; {more} built "
                          "and warmed one at a time while it serves, each taking requests once warm"))
    return 1
