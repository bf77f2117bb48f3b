"""`onnxaccel run`: run a model once on a target and summarize its outputs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from onnxaccel import startup
from onnxaccel.cli.args_data import RUN_IMAGE_HELP, InputArgs, OutputArgs, PreprocessArgs, RunnerArgs
from onnxaccel.cli.args_model import ConfigArgs, ShapeArgs, SourceArg, TargetArgs
from onnxaccel.cli.common import console, handle_errors, note, print_json, warn
from onnxaccel.cli.compose import Built, Group, composed, option
from onnxaccel.cli.groups import warn_if_not_tuned
from onnxaccel.cli.tables import columns, new_table
from onnxaccel.engines import prewarm
from onnxaccel.errors import InputError
from onnxaccel.prepost.post_options import DEFAULT_CONF, DEFAULT_IOU, POSTPROCESS

if TYPE_CHECKING:  # numpy, onnx, the pipeline and the decoders are imported when the command runs
    import numpy as np

    from onnxaccel.model import Model
    from onnxaccel.prepost.post import PostResult

SCHEMA = "onnxaccel.run/1"


@dataclass
class OutputSummary:
    """One output: its type and shape and, for numbers, min/max/mean and NaN/Inf counts.

    Sequences are summarized over their elements (``kind`` 'sequence', ``shape`` [length]); an empty optional
    is ``kind`` 'none'; strings have no statistics.
    """

    name: str
    dtype: str
    shape: list[int]
    min: float | None
    max: float | None
    mean: float | None
    nan: int
    inf: int
    topk: list[list[tuple[int, float]]] = field(default_factory=list)
    kind: str = "tensor"
    #: The L2 norm of the finite values (per row in ``row_norms`` for an [N, D] output, first 8 rows).
    norm: float | None = None
    row_norms: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, value, k: int) -> OutputSummary:
        """Summarize one output value (array, sequence, map or empty optional); top-``k`` for classifiers."""
        import numpy as np

        if value is None:
            return cls(name, "none", [], None, None, None, 0, 0, kind="none")
        if isinstance(value, dict):
            return cls(name, "map", [len(value)], None, None, None, 0, 0, kind="map")
        if isinstance(value, list):
            arrays = [np.asarray(v) for v in value]
            flat = [a.ravel() for a in arrays if a.dtype.kind != "O"]
            merged = np.concatenate(flat) if flat and len({a.dtype for a in arrays}) == 1 else None
            inner = cls.of(name, merged, 0) if merged is not None else None
            dtype = f"seq({arrays[0].dtype.name if arrays else '?'})"
            return cls(name, dtype, [len(arrays)], inner and inner.min, inner and inner.max, inner and inner.mean,
                       inner.nan if inner else 0, inner.inf if inner else 0, kind="sequence")
        value = np.asarray(value)
        as_float = _as_float(value)
        finite = as_float[np.isfinite(as_float)] if as_float is not None else None
        topk: list[list[tuple[int, float]]] = []
        # Classifier-like outputs only: [N, C], or [N, C, 1, 1] as SqueezeNet writes it.
        squeezed = value.reshape(value.shape[:2]) if value.ndim > 2 and all(d == 1 for d in value.shape[2:]) else value
        if k > 0 and value.dtype.kind == "f" and squeezed.ndim == 2 and squeezed.shape[1] > 1:
            for row in squeezed:
                idx = np.argsort(-row, kind="stable")[:k]
                topk.append([(int(i), float(row[i])) for i in idx])
        floating = as_float is not None and (value.dtype.kind == "f" or value.dtype.kind == "V")
        norms = []
        if floating and value.ndim == 2 and value.shape[0]:
            norms = [float(np.linalg.norm(np.nan_to_num(r, posinf=0, neginf=0))) for r in as_float[:8]]
        return cls(
            norm=float(np.linalg.norm(finite)) if floating and finite is not None and finite.size else None,
            row_norms=norms,
            name=name, dtype="string" if value.dtype.kind in "OUS" else value.dtype.name, shape=list(value.shape),
            min=float(finite.min()) if finite is not None and finite.size else None,
            max=float(finite.max()) if finite is not None and finite.size else None,
            mean=float(finite.mean()) if finite is not None and finite.size else None,
            nan=int(np.isnan(as_float).sum()) if floating else 0,
            inf=int(np.isinf(as_float).sum()) if floating else 0,
            topk=topk,
        )

    def to_dict(self) -> dict:
        """The summary as JSON-ready values (the `outputs` entries of `run --json`)."""
        return {"name": self.name, "kind": self.kind, "dtype": self.dtype, "shape": self.shape, "min": self.min,
                "max": self.max, "mean": self.mean, "norm": self.norm, "row_norms": self.row_norms, "nan": self.nan,
                "inf": self.inf,
                "topk": [[{"index": i, "score": s} for i, s in row] for row in self.topk]}


def _as_float(value: np.ndarray) -> np.ndarray | None:
    """float64 values of a numeric array (bool, ints, floats, ml_dtypes bfloat16/float8/int4); None otherwise."""
    import numpy as np

    if not value.size or value.dtype.kind in "OUSc":
        return None
    try:
        return value.astype(np.float64)
    except (TypeError, ValueError):
        return None


@dataclass
class RunResult:
    """What `run` found: where the model ran, how long it took, its inputs and a summary of its outputs."""

    model: str
    target: str
    providers: list[str]
    iobinding: bool
    compile_seconds: float
    latency_ms: float
    input_shapes: dict[str, list[int]]
    placement: dict
    outputs: list[OutputSummary]
    warnings: list[str]
    saved: str | None = None
    #: Where each input came from: given (file, literal, image) or synthesized (and how), shape and type.
    inputs: list[dict] = field(default_factory=list)
    #: Image inputs -> the preset, its parameters and the geometry applied (also in ``inputs``).
    preprocess: dict[str, dict] = field(default_factory=dict)
    #: The post-processing applied (kind, who chose it, top-k with labels or detections).
    postprocess: dict | None = None
    #: What ran: the ExecutionPlan (plan.py ExecutionPlan.to_dict).
    plan: dict | None = None
    #: Where the time to the first result went (startup.py Startup.to_dict).
    startup: dict | None = None

    def to_dict(self) -> dict:
        """The result as `run --json` prints it (schema onnxaccel.run/1)."""
        return {
            "schema": SCHEMA, "model": self.model, "target": self.target, "providers": self.providers,
            "iobinding": self.iobinding, "compile_seconds": self.compile_seconds, "latency_ms": self.latency_ms,
            "input_shapes": self.input_shapes, "placement": self.placement,
            "inputs": self.inputs, "preprocess": self.preprocess, "outputs": [o.to_dict() for o in self.outputs],
            "postprocess": self.postprocess, "warnings": self.warnings, "saved": self.saved, "plan": self.plan,
            "startup": self.startup,
        }


def register(app: typer.Typer) -> None:
    """Add `run` to the `onnxaccel` app."""
    app.command("run", help="Run a model once on a target: synthesized or given inputs, an output summary "
                "or top-k, where each node ran.")(run_command)


class ResultArgs(Group):
    """What `run` shows and keeps of the outputs: --topk, --save, and the post-processing (--postprocess,
    --conf, --iou, --draw). Builds their values (--postprocess lower-cased)."""

    PARAMS = (
        option("topk", int, 5, "--topk", "-k", help="Show the K best classes of classifier outputs."),
        option("save", Path | None, None, "--save", help="Write the outputs: FILE.npz (arrays), or a folder (a name "
               "ending in / or without suffix) or FILE.pb for ONNX protobufs output_K.pb, as ONNX's test data sets "
               "store them (every type: sequences, optionals, bfloat16, int4...)."),
        option("postprocess", str | None, None, "--postprocess", help=f"{'|'.join(POSTPROCESS)}: top-k with "
               "the class names in the model's metadata (names/labels/classes), else ImageNet labels for 1000 "
               "classes; YOLOv8 boxes with NMS, letterbox undone. (default: detect for Ultralytics task=detect, "
               "topk for an N x 1000 output or N x C with C names in the metadata, else none)"),
        option("conf", float, DEFAULT_CONF, "--conf", help="Detection score threshold (--postprocess detect)."),
        option("iou", float, DEFAULT_IOU, "--iou", help="NMS IoU threshold (--postprocess detect)."),
        option("draw", Path | None, None, "--draw", help="Draw the detections on the input image and write it here "
               "(e.g. out.jpg; --postprocess detect)."),
    )

    def build(self, v: SimpleNamespace, ctx: Built) -> SimpleNamespace:
        """The object the class docstring names, from the options' values."""
        return SimpleNamespace(**{**vars(v), "postprocess": v.postprocess.lower() if v.postprocess else None})


#: The order of the options in --help.
ORDER = ("model inputs value_range target precision ep_option shape batch topk save iobinding strict preprocess "
         "postprocess conf iou draw mean std resize layout bgr seed no_check config as_json")


@handle_errors
@composed(
    SourceArg("An .onnx file or a built-in zoo:NAME (see `onnxaccel zoo list`)."), InputArgs(),
    TargetArgs(config=True), ShapeArgs(), ResultArgs(), RunnerArgs(iobinding="one", check="Skip the ONNX checker."),
    PreprocessArgs(image=RUN_IMAGE_HELP), ConfigArgs("target, shapes, batch and IO binding"), OutputArgs(),
    order=ORDER,
)
def run_command(model, given, target, shapes, want, execution, preprocess, tuned, as_json) -> None:
    """Run MODEL once; options a --config can set resolve as flag > config > default (cli/groups.py)."""
    prewarm.start(target)  # a GPU provider's libraries load while the command imports and reads the model
    with startup.stage("import", detail="the command's modules (onnx, numpy)"):  # deferred from start-up
        from onnxaccel.pipeline import prepare
        from onnxaccel.prepost.post import choose_postprocess

    if tuned is not None and not model.startswith("zoo:"):
        warn_if_not_tuned(tuned, model)
    prepared = prepare(model, target, inputs=list(given.items), shapes=shapes.shapes, batch=shapes.batch,
                       strict=execution.strict, preprocess=preprocess.request, seed=given.seed, check=execution.check,
                       value_ranges=given.value_ranges)
    runner = prepared.runner
    start = time.perf_counter()
    with startup.stage("first run", detail="IO binding" if execution.iobinding else "numpy in/out"):
        outputs = prepared.run(iobinding=execution.iobinding)
    latency = (time.perf_counter() - start) * 1e3
    started = startup.summary(first_result=True)
    warnings = list(prepared.warnings) + [o.note for o in prepared.origins if o.note]
    warnings += [f"input '{o.name}': {o.image.warning}" for o in prepared.origins if o.image and o.image.warning]
    images = [(Path(o.image.source), o.image) for o in prepared.origins if o.image is not None and o.image.source]
    graph = prepared.model.proto.graph
    kind, why = choose_postprocess(want.postprocess, prepared.model.metadata, outputs, graph)
    post = postprocess_outputs(kind, why, outputs, prepared.model.metadata, images=images, k=want.topk,
                               conf=want.conf, iou=want.iou, draw=want.draw, graph=graph)
    # Raw top-k only for the output post-processing ranks: an embedding or other tensor is summarised instead.
    ranked = {post.output} if post.kind == "topk" else set()
    saved = None
    if want.save is not None:
        saved, skipped = save_outputs(want.save, outputs, prepared.model)
        if skipped:
            warnings.append(f"not saved in {want.save.name} (a .npz holds arrays only): {', '.join(skipped)}; "
                            f"use --save DIR/ for ONNX .pb files of every type")
    result = RunResult(
        model=model, target=str(target), providers=runner.providers, iobinding=execution.iobinding,
        compile_seconds=runner.compile_seconds, latency_ms=latency,
        input_shapes={k: list(v) for k, v in prepared.model.input_shapes.items()},
        placement=runner.placement.to_dict(),
        outputs=[OutputSummary.of(k, v, want.topk if k in ranked else 0) for k, v in outputs.items()],
        warnings=warnings, saved=saved, inputs=[o.to_dict() for o in prepared.origins],
        preprocess={o.name: o.image.to_dict() for o in prepared.origins if o.image is not None},
        postprocess=post.to_dict(), plan=prepared.plan.to_dict() if prepared.plan else None,
        startup=started.to_dict(),
    )
    if as_json:
        print_json(result.to_dict())
        return
    _render(result)


def postprocess_outputs(kind: str, why: str, outputs: dict, metadata: dict, **options) -> PostResult:
    """prepost.post.postprocess, checking the thresholds first (a clear error rather than no boxes)."""
    from onnxaccel.prepost.post import postprocess

    for flag in ("conf", "iou"):
        if not 0 <= options[flag] <= 1:
            raise InputError(f"--{flag} must be between 0 and 1, got {options[flag]}.", f"e.g. --{flag} 0.5")
    return postprocess(kind, why, outputs, metadata, **options)


def save_outputs(path: Path, outputs: dict, model: Model) -> tuple[str, list[str]]:
    """Write outputs to ``path``: a .npz of the arrays (returns the outputs a .npz cannot hold), or a folder
    (or ``FILE.pb`` for a single output) of ONNX protobufs ``output_K.pb``, K in the graph's output order."""
    import numpy as np

    from onnxaccel.protobuf_values import write_pb

    if path.suffix.lower() == ".npz":
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays, skipped = {}, []
        for name, value in outputs.items():
            if isinstance(value, np.ndarray) and value.dtype.kind not in "OV":
                arrays[name] = value
            elif isinstance(value, np.ndarray) and value.dtype.kind == "O":
                arrays[name] = value.astype(str)  # numpy unicode: loads without pickles
            elif isinstance(value, np.ndarray):
                arrays[name] = value  # ml_dtypes arrays are stored by their bits ('|V2'); they load as such
            else:
                skipped.append(f"{name} ({'empty optional' if value is None else type(value).__name__})")
        np.savez(path, **arrays)
        return str(path), skipped
    types = {s.name: s.type_proto for s in model.outputs}
    if path.suffix.lower() == ".pb" and len(outputs) == 1:
        path.parent.mkdir(parents=True, exist_ok=True)
        name, value = next(iter(outputs.items()))
        write_pb(path, value, name, types.get(name))
        return str(path), []
    if path.suffix and path.suffix.lower() not in (".pb",):
        raise InputError(f"--save {path}: write a .npz file, a .pb file (one output) or a folder.",
                         "e.g. --save out.npz or --save outputs/")
    folder = path.with_suffix("") if path.suffix else path
    folder.mkdir(parents=True, exist_ok=True)
    for index, (name, value) in enumerate(outputs.items()):
        write_pb(folder / f"output_{index}.pb", value, name, types.get(name))
    return str(folder), []


def _render(result: RunResult) -> None:
    for message in result.warnings:
        loud = ("fall", "took", "cropped the image", "changed the aspect ratio")
        (warn if any(word in message for word in loud) else note)(message)
    shapes = ", ".join(f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in result.input_shapes.items())
    console.print(f"[bold]{escape(result.model)}[/] on [bold]{escape(result.target)}[/] ({result.providers[0]}); inputs {shapes}")
    for origin in result.inputs:
        shape = "x".join(map(str, origin["shape"])) if origin["shape"] else ("scalar" if origin["shape"] == [] else "")
        console.print(f"  input {origin['name']}: {origin['type']} {shape}, {origin['source']} ({origin['detail']})",
                      markup=False, highlight=False)
    for choice in (result.plan or {}).get("choices", ()):
        if choice["name"] in ("target", "precision"):
            console.print(f"plan: {choice['name']}: {choice['value']} ({choice['reason']})", markup=False,
                          highlight=False)
    console.print(f"placement: {result.placement['summary']}", markup=False)
    console.print(f"session created in {result.compile_seconds * 1e3:.1f} ms; first run "
                  f"{result.latency_ms:.2f} ms ({'IO binding' if result.iobinding else 'numpy in/out'})")
    if result.startup:
        console.print(startup.Startup.from_dict(result.startup).line(), markup=False, highlight=False)
    table = columns(new_table("outputs"), ("name", "dtype", "shape", "min", "max", "mean", "norm", "NaN/Inf"),
                    numbers=("min", "max", "mean", "norm", "NaN/Inf"))
    for out in result.outputs:
        fmt = (lambda v: "-" if v is None else f"{v:.4g}")
        shape = f"[{out.shape[0]}]" if out.kind == "sequence" else "x".join(map(str, out.shape)) or "scalar"
        table.add_row(escape(out.name), out.dtype, "-" if out.kind == "none" else escape(shape), fmt(out.min),
                      fmt(out.max),
                      fmt(out.mean), fmt(out.norm), f"{out.nan}/{out.inf}" if out.nan or out.inf else "0")
    console.print(table)
    for out in result.outputs:
        if len(out.row_norms) > 1:
            console.print(f"{out.name}: L2 norm per row " + ", ".join(f"{n:.4g}" for n in out.row_norms), markup=False,
                          highlight=False)
        for i, row in enumerate(out.topk[:8]):
            ranked = ", ".join(f"{idx} ({score:.4f})" for idx, score in row)
            console.print(f"top-{len(row)} {out.name}[{i}]: {ranked}", markup=False)
        if len(out.topk) > 8:
            console.print(f"... {len(out.topk) - 8} more rows (use --json or --save)")
    if result.postprocess:
        _render_post(result.postprocess)
    if result.saved:
        console.print(f"outputs saved to {result.saved}")


def _render_post(post: dict) -> None:
    """The post-processing: a detections table, or labelled top-k rows."""
    if post["kind"] == "none":
        return
    labels = f", class names from {post['labels']}" if post.get("labels") else ""
    console.print(f"postprocess {post['kind']} ({post['origin']}{labels}): {post['params']}", markup=False,
                  highlight=False)
    for message in post["notes"]:
        note(message)
    if post["kind"] == "topk":
        for i, row in enumerate(post["topk"][:8]):
            ranked = ", ".join(f"{_class(r)}: {r['probability']:.3f}" for r in row)
            console.print(f"top-{len(row)} {post['output']}[{i}]: {ranked}", markup=False, highlight=False)
        return
    for i, dets in enumerate(post["detections"]):
        table = columns(new_table(f"detections, image {i} ({len(dets)})"), ("class", "score", "x1", "y1", "x2", "y2"),
                        numbers=("score", "x1", "y1", "x2", "y2"))
        for det in dets:
            table.add_row(escape(det["class"]), f"{det['score']:.3f}", *(f"{v:.1f}" for v in det["box"]))
        console.print(table)
    if post.get("drawn"):
        console.print(f"detections drawn on {post['drawn']}", markup=False, highlight=False)



def _class(ranked: dict) -> str:
    """A ranked class as `run` prints it: its index, and its name in parentheses when it has one."""
    return f"{ranked['index']} ({ranked['label']})" if ranked["label"] else str(ranked["index"])
