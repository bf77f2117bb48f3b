"""Compose the three nouns: load a Model, bind its shapes, prepare its precision, compile a Runner.

Every command that runs a model (run, bench, compare, profile, serve, batch) goes through ``prepare`` so
that they agree on shapes, precision handling, placement checks and warnings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.engines import Runner, compile_model
from onnxaccel.inputs import ImagePreprocess, load_feeds
from onnxaccel.model import Model, load_model
from onnxaccel.target import Target
from onnxaccel.transform.precision import prepare_for_target


@dataclass
class Prepared:
    """A bound model, the target it was compiled for, its runner and its feeds."""

    model: Model
    target: Target
    runner: Runner
    feeds: dict[str, np.ndarray]
    warnings: list[str] = field(default_factory=list)

    def close(self) -> None:
        self.runner.close()


def prepare(
    source: str | Model,
    target: Target,
    *,
    inputs: Sequence[str] = (),
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    strict: bool = False,
    preprocess: ImagePreprocess | None = None,
    seed: int = 0,
    check: bool = True,
) -> Prepared:
    """Load (unless given a Model), bind shapes from --shape/--batch/input files, convert precision when
    the provider cannot, and compile. Feeds not given as files are synthesized."""
    model = source if isinstance(source, Model) else load_model(source, check=check)
    bound, feeds = load_feeds(model, inputs, shapes=shapes, batch=batch, preprocess=preprocess, seed=seed)
    runnable, engine_target = prepare_for_target(bound, target)
    runner = compile_model(runnable, engine_target, strict=strict)
    runner.target = target  # report what the user asked for (e.g. cuda/fp16), not the fp32 engine label
    warnings = list(dict.fromkeys(runner.warnings))
    return Prepared(bound, target, runner, feeds, warnings)
