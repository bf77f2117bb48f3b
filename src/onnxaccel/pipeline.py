"""Compose the three nouns: load a Model, bind its shapes, prepare its precision, compile a Runner.

Every command that runs a model (run, bench, compare, profile, serve, batch) goes through ``prepare`` so
that they agree on shapes, precision handling, placement checks and warnings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from onnxaccel.engines import Runner, compile_model
from onnxaccel.errors import InferenceError
from onnxaccel.inputs import FeedOrigin, ImagePreprocess, prepare_feeds
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
    #: Where each input's value came from (file, literal, image, synthesized and how).
    origins: list[FeedOrigin] = field(default_factory=list)

    @property
    def synthesized(self) -> list[FeedOrigin]:
        return [o for o in self.origins if o.synthesized]

    def run(self, *, iobinding: bool = False) -> dict:
        """Run once on the prepared feeds; a failure names the synthesized inputs (see explain_failure)."""
        try:
            if iobinding:
                bound = self.runner.bind(self.feeds)
                bound.run()
                return bound.outputs()
            return self.runner.run(self.feeds)
        except InferenceError as exc:
            raise explain_failure(exc, self.origins) from exc.__cause__

    def close(self) -> None:
        self.runner.close()


def explain_failure(exc: InferenceError, origins: Sequence[FeedOrigin]) -> InferenceError:
    """The same error, its hint saying which inputs were synthesized (shape, type, how drawn) and how to give
    real ones, when any were; else ``exc`` unchanged. Every command that runs synthesized feeds uses it."""
    synthesized = [o for o in origins if o.synthesized]
    if not synthesized or getattr(exc, "explained", False):
        return exc
    listed = "; ".join(o.describe().replace(", synthesized (", " drawn as (") for o in synthesized)
    hint = (f"The run used synthesized values for {len(synthesized)} input(s): {listed}. Random values can be "
            "out of range for the model (indices, lengths, ids): give real ones with --input NAME=FILE "
            "(.npy/.npz/.pb) or NAME=VALUE, or bound them with --value-range NAME=LOW,HIGH.")
    if exc.hint:
        hint += f" Otherwise: {exc.hint}"
    explained = type(exc)(exc.message, hint, details=exc.details)
    explained.explained = True
    return explained


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
    value_ranges: Mapping[str, tuple[float, float]] | None = None,
) -> Prepared:
    """Load (unless given a Model), bind shapes from --shape/--batch/input files, convert precision when
    the provider cannot, and compile. Feeds not given (files, literals) are synthesized, within
    ``value_ranges`` where given (input name, or "" for all -> (LOW, HIGH))."""
    model = source if isinstance(source, Model) else load_model(source, check=check)
    feed_set = prepare_feeds(model, inputs, shapes=shapes, batch=batch, preprocess=preprocess, seed=seed,
                             value_ranges=value_ranges)
    bound, feeds = feed_set.model, feed_set.feeds
    runnable, engine_target = prepare_for_target(bound, target)
    runner = compile_model(runnable, engine_target, strict=strict)
    runner.target = target  # report what the user asked for (e.g. cuda/fp16), not the fp32 engine label
    warnings = list(dict.fromkeys(runner.warnings))
    return Prepared(bound, target, runner, feeds, warnings, feed_set.origins)
