"""Run one model on two targets with the same feeds and compare what comes out (the ``compare`` command).

Running lives in the pipeline, comparing in :mod:`onnxaccel.compare` (after Polygraphy, which keeps the two
apart); this module composes them. The comparison rule, the error metrics and the default tolerances are
:mod:`onnxaccel.compare`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.compare import CompareResult, check_tolerances, compare_outputs
from onnxaccel.model import Model
from onnxaccel.pipeline import prepare
from onnxaccel.target import Target

SCHEMA = "onnxaccel.compare/1"


CPU_FP16_NOTE = ("On the CPU provider ONNX Runtime runs most FP16 ops in FP32, inserting Casts around ops that "
                 "lack FP16 kernels (insert_cast_transformer.cc), so cpu/fp16 shows the effect of FP16 weights "
                 "(and of FP16 storage where the runtime keeps it), not of FP16 arithmetic; a GPU target shows that.")


@dataclass
class TargetRun:
    """One side of a target comparison: where it ran, how the graph was placed, how long it took to compile."""

    target: str
    providers: list[str]
    placement: dict
    compile_seconds: float
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"target": self.target, "providers": self.providers, "placement": self.placement,
                "compile_seconds": self.compile_seconds, "warnings": self.warnings}


@dataclass
class TargetComparison:
    """The result of ``compare_targets``: both runs and the comparison of their outputs."""

    model: str
    reference: TargetRun
    candidate: TargetRun
    input_shapes: dict[str, list[int]]
    result: CompareResult
    notes: list[str] = field(default_factory=list)
    feeds: dict[str, np.ndarray] = field(repr=False, default_factory=dict)
    bound_model: Model | None = field(repr=False, default=None)

    def to_dict(self) -> dict:
        """JSON-ready form, versioned by SCHEMA."""
        return {"schema": SCHEMA, "model": self.model, "reference": self.reference.to_dict(),
                "candidate": self.candidate.to_dict(), "input_shapes": self.input_shapes,
                **self.result.to_dict(), "notes": self.notes}


def compare_targets(
    source: str | Model,
    reference: Target,
    candidate: Target,
    *,
    atol: float,
    rtol: float,
    topk: int = 5,
    inputs: Sequence[str] = (),
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    seed: int = 0,
    strict: bool = False,
    value_ranges: Mapping[str, tuple[float, float]] | None = None,
) -> TargetComparison:
    """Run the model on both targets with the same feeds and compare the outputs."""
    check_tolerances(atol, rtol)
    first = prepare(source, reference, inputs=inputs, shapes=shapes, batch=batch, seed=seed, strict=strict,
                    value_ranges=value_ranges)
    try:
        ref_out = first.run()  # a failure names the synthesized inputs (pipeline.explain_failure)
        ref_run = _target_run(first)
    finally:
        first.close()
    second = prepare(first.model, candidate, inputs=inputs, shapes=shapes, batch=batch, seed=seed, strict=strict)
    try:
        cand_out = second.runner.run(first.feeds)
        cand_run = _target_run(second)
    finally:
        second.close()
    return TargetComparison(
        model=str(source) if not isinstance(source, Model) else source.source,
        reference=ref_run, candidate=cand_run,
        input_shapes={k: list(v) for k, v in first.model.input_shapes.items()},
        result=compare_outputs(ref_out, cand_out, atol=atol, rtol=rtol, topk=topk),
        notes=[CPU_FP16_NOTE] if any(t.device == "cpu" and t.precision == "fp16" for t in (reference, candidate))
        else [],
        feeds=first.feeds, bound_model=first.model,
    )


def _target_run(prepared) -> TargetRun:
    runner = prepared.runner
    return TargetRun(str(prepared.target), list(runner.providers), runner.placement.to_dict(),
                     runner.compile_seconds, list(prepared.warnings))
