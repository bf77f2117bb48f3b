"""`onnxaccel run`: run a model once on a target and summarize its outputs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.markup import escape
from rich.table import Table

from onnxaccel.cli.common import (
    BatchOpt, EpOptionOpt, JsonOpt, PrecisionOpt, ShapeOpt, StrictOpt, TargetOpt, console, handle_errors,
    note, print_json, resolve_target, warn,
)
from onnxaccel.errors import InputError
from onnxaccel.inputs import IMAGENET_MEAN, IMAGENET_STD, ImagePreprocess
from onnxaccel.model import parse_shape_bindings
from onnxaccel.pipeline import prepare

SCHEMA = "onnxaccel.run/1"


@dataclass
class OutputSummary:
    name: str
    dtype: str
    shape: list[int]
    min: float | None
    max: float | None
    mean: float | None
    nan: int
    inf: int
    topk: list[list[tuple[int, float]]] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, value: np.ndarray, k: int) -> OutputSummary:
        numeric = value.dtype.kind in "fiub"
        as_float = value.astype(np.float64) if numeric and value.size else None
        finite = as_float[np.isfinite(as_float)] if as_float is not None else None
        topk: list[list[tuple[int, float]]] = []
        # Classifier-like outputs only: [N, C], or [N, C, 1, 1] as SqueezeNet writes it.
        squeezed = value.reshape(value.shape[:2]) if value.ndim > 2 and all(d == 1 for d in value.shape[2:]) else value
        if k > 0 and value.dtype.kind == "f" and squeezed.ndim == 2 and squeezed.shape[1] > 1:
            for row in squeezed:
                idx = np.argsort(-row, kind="stable")[:k]
                topk.append([(int(i), float(row[i])) for i in idx])
        return cls(
            name=name, dtype=value.dtype.name, shape=list(value.shape),
            min=float(finite.min()) if finite is not None and finite.size else None,
            max=float(finite.max()) if finite is not None and finite.size else None,
            mean=float(finite.mean()) if finite is not None and finite.size else None,
            nan=int(np.isnan(value).sum()) if value.dtype.kind == "f" else 0,
            inf=int(np.isinf(value).sum()) if value.dtype.kind == "f" else 0,
            topk=topk,
        )

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": self.shape, "min": self.min, "max": self.max,
                "mean": self.mean, "nan": self.nan, "inf": self.inf,
                "topk": [[{"index": i, "score": s} for i, s in row] for row in self.topk]}


@dataclass
class RunResult:
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

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "model": self.model, "target": self.target, "providers": self.providers,
            "iobinding": self.iobinding, "compile_seconds": self.compile_seconds, "latency_ms": self.latency_ms,
            "input_shapes": self.input_shapes, "placement": self.placement,
            "outputs": [o.to_dict() for o in self.outputs], "warnings": self.warnings, "saved": self.saved,
        }


def register(app: typer.Typer) -> None:
    app.command("run", help="Run a model once on a target: synthesized or given inputs, an output summary "
                "or top-k, where each node ran.")(run_command)


@handle_errors
def run_command(
    model: Annotated[str, typer.Argument(help="An .onnx file or a built-in zoo:NAME (see `onnxaccel zoo list`).")],
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE (.npy, .npz or an image); "
                      "a bare .npz feeds every input it names. Inputs not given are synthesized.")] = None,
    target: TargetOpt = "auto",
    precision: PrecisionOpt = None,
    ep_option: EpOptionOpt = None,
    shape: ShapeOpt = None,
    batch: BatchOpt = None,
    topk: Annotated[int, typer.Option("--topk", "-k", help="Show the K best classes of classifier outputs.")] = 5,
    save: Annotated[Path | None, typer.Option("--save", help="Write every output to this .npz file.")] = None,
    iobinding: Annotated[bool, typer.Option("--iobinding/--no-iobinding", help="Keep inputs and outputs on the "
                         "device (IO binding) or pass numpy arrays.")] = True,
    strict: StrictOpt = False,
    mean: Annotated[str | None, typer.Option(help="Image normalization mean, e.g. 0.485,0.456,0.406.")] = None,
    std: Annotated[str | None, typer.Option(help="Image normalization std, e.g. 0.229,0.224,0.225.")] = None,
    resize: Annotated[int | None, typer.Option(help="Image shorter side before the center crop.")] = None,
    layout: Annotated[str, typer.Option(help="Image tensor layout: nchw or nhwc.")] = "nchw",
    bgr: Annotated[bool, typer.Option("--bgr", help="Feed images as BGR instead of RGB.")] = False,
    seed: Annotated[int, typer.Option(help="Seed for synthesized inputs.")] = 0,
    no_check: Annotated[bool, typer.Option("--no-check", help="Skip the ONNX checker.")] = False,
    config: Annotated[Path | None, typer.Option("--config", help="A configuration written by `onnxaccel tune`: "
                      "its target, shapes, batch and IO binding are used unless given here.")] = None,
    as_json: JsonOpt = False,
) -> None:
    if config is not None:
        from onnxaccel.bench.config import load_config

        tuned = load_config(config)
        if target == "auto":
            target = str(tuned.target)
        if not shape:
            shape = [f"{k}={'x'.join(map(str, v))}" for k, v in tuned.shapes.items()]
        batch = batch if batch is not None else tuned.batch
        iobinding = tuned.iobinding if tuned.iobinding is not None else iobinding
        mismatch = tuned.check_model(model) if not model.startswith("zoo:") else None
        if mismatch:
            warn(mismatch)
    tgt = resolve_target(target, precision, ep_option)
    pre = ImagePreprocess(
        resize=resize, mean=_floats(mean, "--mean") if mean else IMAGENET_MEAN,
        std=_floats(std, "--std") if std else IMAGENET_STD, layout=layout.lower(),
        channel_order="bgr" if bgr else "rgb",
    )
    if pre.layout not in ("nchw", "nhwc"):
        raise InputError(f"--layout must be nchw or nhwc, got '{layout}'.", "Use --layout nchw or --layout nhwc.")
    prepared = prepare(model, tgt, inputs=inputs or [], shapes=parse_shape_bindings(shape or []), batch=batch,
                       strict=strict, preprocess=pre, seed=seed, check=not no_check)
    runner = prepared.runner
    start = time.perf_counter()
    if iobinding:
        bound = runner.bind(prepared.feeds)
        bound.run()
        outputs = bound.outputs()
    else:
        outputs = runner.run(prepared.feeds)
    latency = (time.perf_counter() - start) * 1e3
    saved = None
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        np.savez(save, **outputs)
        saved = str(save)
    result = RunResult(
        model=model, target=str(tgt), providers=runner.providers, iobinding=iobinding,
        compile_seconds=runner.compile_seconds, latency_ms=latency,
        input_shapes={k: list(v) for k, v in prepared.model.input_shapes.items()},
        placement=runner.placement.to_dict(),
        outputs=[OutputSummary.of(k, v, topk) for k, v in outputs.items()],
        warnings=prepared.warnings, saved=saved,
    )
    if as_json:
        print_json(result.to_dict())
        return
    _render(result)


def _render(result: RunResult) -> None:
    for message in result.warnings:
        (warn if "fall" in message or "took" in message else note)(message)
    shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in result.input_shapes.items())
    console.print(f"[bold]{escape(result.model)}[/] on [bold]{escape(result.target)}[/] ({result.providers[0]}); inputs {shapes}")
    console.print(f"placement: {result.placement['summary']}", markup=False)
    console.print(f"session created in {result.compile_seconds * 1e3:.1f} ms; first run "
                  f"{result.latency_ms:.2f} ms ({'IO binding' if result.iobinding else 'numpy in/out'})")
    table = Table(title="outputs", title_justify="left")
    for col in ("name", "dtype", "shape", "min", "max", "mean", "NaN/Inf"):
        table.add_column(col, justify="right" if col in ("min", "max", "mean") else "left")
    for out in result.outputs:
        fmt = (lambda v: "-" if v is None else f"{v:.4g}")
        table.add_row(out.name, out.dtype, "x".join(map(str, out.shape)), fmt(out.min), fmt(out.max),
                      fmt(out.mean), f"{out.nan}/{out.inf}" if out.nan or out.inf else "0")
    console.print(table)
    for out in result.outputs:
        for i, row in enumerate(out.topk[:8]):
            ranked = ", ".join(f"{idx} ({score:.4f})" for idx, score in row)
            console.print(f"top-{len(row)} {out.name}[{i}]: {ranked}", markup=False)
        if len(out.topk) > 8:
            console.print(f"... {len(out.topk) - 8} more rows (use --json or --save)")
    if result.saved:
        console.print(f"outputs saved to {result.saved}")


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"{option} must be comma-separated numbers, got '{text}'.", f"e.g. {option} 0.5,0.5,0.5") from None
