"""Accuracy of a benchmarked configuration against the FP32 reference on the same device.

The reference of a cell is the model as given (FP32, no provider options) on the same device, fed the same
synthesized inputs (same seed, same shapes). A sweep that measures that plain target anyway lends its
outputs; otherwise the reference is computed once per device and shape. Comparing is
``onnxaccel.compare.compare_outputs``; the verdict is ``onnxaccel.compare.evaluate`` with a ``GateSpec``, so
``bench``, ``tune`` and ``optimize`` judge "accurate enough" by the same rules:

* default: every element within the precision's default ``atol + rtol * |reference|`` (the tolerances
  ``onnxaccel compare`` uses: onnxaccel.compare.DEFAULT_TOLERANCES), and no new NaN/Inf;
* ``max_error``: the largest absolute error over all outputs is at most ``max_error`` (replaces the
  element-wise check), and no new NaN/Inf.

Outputs of IO-bound cells are read back from the bound run after timing, so a configuration that computes
wrong results (e.g. a CUDA graph replaying stale buffers) fails here instead of looking fast.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from onnxaccel.compare import DEFAULT_TOLERANCES, GateSpec, compare_outputs, evaluate
from onnxaccel.errors import UsageError
from onnxaccel.target import Target, parse_target

Outputs = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class AccuracyGate:
    """What "accurate enough" means: ``max_error`` (absolute) if given, else element-wise tolerances
    (``atol``/``rtol`` if given, else the precision's defaults)."""

    max_error: float | None = None
    atol: float | None = None
    rtol: float | None = None

    def __post_init__(self):
        for label, value in (("max-error", self.max_error), ("atol", self.atol), ("rtol", self.rtol)):
            if value is not None and (not np.isfinite(value) or value < 0):
                raise UsageError(f"--{label} must be a finite number >= 0, got {value}.", f"e.g. --{label} 0.01")

    def spec(self, precision: str) -> GateSpec:
        """The GateSpec for a cell of ``precision``: given thresholds, else that precision's defaults."""
        atol, rtol = DEFAULT_TOLERANCES.get(precision, DEFAULT_TOLERANCES["fp32"])
        return GateSpec(atol=self.atol if self.atol is not None else atol,
                        rtol=self.rtol if self.rtol is not None else rtol,
                        elementwise=self.max_error is None, max_error=self.max_error, topk=1)

    def to_dict(self) -> dict:
        """JSON-ready form, with the rule in words."""
        return {"max_error": self.max_error, "atol": self.atol, "rtol": self.rtol,
                "rule": "max_abs <= max_error" if self.max_error is not None else
                "|candidate - reference| <= atol + rtol * |reference| (per precision defaults unless given)"}


def reference_target(target: Target) -> Target:
    """The plain FP32 target on the same device: what the model does without any of our knobs."""
    text = target.device + (f":{target.device_id}" if target.device_id is not None else "")
    return parse_target(text, engine=target.engine)


def is_reference(target: Target) -> bool:
    """Whether ``target`` is its own reference: FP32 with no provider options."""
    return target.precision == "fp32" and not target.options


def check(reference: Outputs, candidate: Outputs, *, precision: str, gate: AccuracyGate, label: str) -> dict:
    """Compare and judge; the dict goes into the cell as ``accuracy``."""
    spec = gate.spec(precision)
    comparison = compare_outputs(reference, candidate, atol=spec.atol, rtol=spec.rtol, topk=5)
    verdict = evaluate(comparison, spec)
    return {"reference": label, "passed": verdict.passed, "max_abs": verdict.max_abs,
            "topk_agreement": verdict.topk_agreement, "gate": spec.to_dict(),
            "checks": [c.to_dict() for c in verdict.checks],
            "outputs": [{"name": o.name, "max_abs": o.max_abs, "mean_abs": o.mean_abs, "max_rel": o.max_rel,
                         "cosine": o.cosine, "mismatched": o.mismatched, "size": o.size,
                         "top1": o.topk.top1 if o.topk else None} for o in comparison.outputs]}


class ReferenceStore:
    """FP32 reference outputs by (device, device id, engine, input shapes), computed at most once each."""

    def __init__(self):
        self._outputs: dict[tuple, tuple[dict[str, np.ndarray], str]] = {}

    @staticmethod
    def key(target: Target, shapes: Mapping[str, tuple[int, ...]]) -> tuple:
        """What references are stored by: device, device id, engine and input shapes."""
        return (target.device, target.device_id, target.engine, tuple(sorted((k, tuple(v)) for k, v in shapes.items())))

    def put(self, target: Target, shapes: Mapping[str, tuple[int, ...]], outputs: Outputs) -> None:
        """Lend the outputs of a plain FP32 cell as the reference (copied; the first one stored wins)."""
        key = self.key(target, shapes)
        if key not in self._outputs:
            copies = {k: np.array(v, copy=True) for k, v in outputs.items()}
            self._outputs[key] = (copies, f"{reference_target(target)} (fp32)")

    def get(self, target: Target, shapes: Mapping[str, tuple[int, ...]],
            compute: Callable[[Target], Outputs]) -> tuple[dict[str, np.ndarray], str]:
        """The reference for ``target``; ``compute(reference_target)`` runs it when not stored yet."""
        key = self.key(target, shapes)
        if key not in self._outputs:
            ref = reference_target(target)
            self._outputs[key] = ({k: np.asarray(v) for k, v in compute(ref).items()}, f"{ref} (fp32)")
        return self._outputs[key]
