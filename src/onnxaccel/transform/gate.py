"""Running the accuracy gate: sample inputs, reference outputs, judging a candidate, locating divergence.

The reference is always the original model at FP32 on the CPU provider (the most trustworthy numbers this
machine has); the candidate runs on the requested target when that provider loads here, else on the CPU.
Judging is :mod:`onnxaccel.compare`'s (``compare_outputs`` then ``evaluate`` with the run's ``GateSpec``), the
same rules ``compare``, ``bench`` and ``tune`` apply.

Locating the first diverging node (for AMP) is ``analysis.bisect.find_divergence``: ``analysis`` is a feature
beside ``transform``, which may not import it (docs/ARCHITECTURE.md, "Layers"), so whoever composes the two
(``onnxaccel.cli.optimize``) passes it in as a :class:`DivergenceFinder`.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from onnxaccel.compare import GateResult, GateSpec, compare_outputs, evaluate
from onnxaccel.engines import compile_model
from onnxaccel.errors import UsageError
from onnxaccel.inputs import ImagePreprocess, synthesize
from onnxaccel.model import Model
from onnxaccel.precision import prepare_for_target
from onnxaccel.precision.fp16 import set_keep_fp32_nodes
from onnxaccel.target import Target, parse_target
from onnxaccel.calibration import CalibrationData, load_calibration
from onnxaccel.transform.evaluate import join, model_at

CPU = parse_target("cpu")


class Divergence(Protocol):
    """What a divergence finder reports (``analysis.bisect.DivergenceResult`` is one)."""

    @property
    def found(self) -> bool:
        """Whether a diverging node was found."""

    @property
    def node(self) -> str | None:
        """The node's name, when found."""

    @property
    def message(self) -> str:
        """What was found, in words."""


class DivergenceFinder(Protocol):
    """``find_divergence(model, reference, candidate, feeds, *, atol, rtol)``: the first node where two targets
    (here FP32 and FP16) of one model diverge; ``analysis.bisect.find_divergence`` is one."""

    def __call__(self, model: Model, reference: Target, candidate: Target, feeds: Mapping[str, np.ndarray], /, *,
                 atol: float, rtol: float) -> Divergence:
        """Search ``model`` run on both targets with ``feeds``; ``atol``/``rtol`` say what diverging means."""


def need_finder(finder: DivergenceFinder | None) -> DivergenceFinder:
    """``finder``, or a UsageError that says how to supply one (AMP cannot search without it)."""
    if finder is None:
        raise UsageError("Automatic mixed precision needs a divergence finder to locate the nodes to keep in FP32, "
                         "and none was given.",
                         "Pass find_divergence=onnxaccel.analysis.bisect.find_divergence to "
                         "onnxaccel.transform.optimize.optimize (the `optimize --amp` command does).")
    return finder


@dataclass
class Samples:
    """The inputs the gate judges on, where they came from, and whether they were synthesized."""

    feeds: list[dict[str, np.ndarray]]
    source: str
    synthetic: bool

    def shapes(self) -> dict[str, list[list[int]]]:
        """Input name -> the distinct shapes the samples gave it (what the accuracy check covered)."""
        found: dict[str, list[list[int]]] = {}
        for feeds in self.feeds:
            for name, value in feeds.items():
                shape = [int(d) for d in np.shape(value)]
                if shape not in found.setdefault(name, []):
                    found[name].append(shape)
        return found

    def to_dict(self) -> dict:
        """JSON-ready form (the count and the input shapes, not the feeds)."""
        return {"source": self.source, "count": len(self.feeds), "synthetic": self.synthetic,
                "shapes": self.shapes()}


def gate_samples(bound: Model, *, eval_data: str | None, calibration: CalibrationData | None, count: int,
                 preprocess: ImagePreprocess | None, seed: int) -> Samples:
    """--eval-data if given; else real calibration data (first ``count``); else synthesized feeds."""
    if eval_data:
        data = load_calibration(eval_data, bound, max_samples=count, preprocess=preprocess, seed=seed)
        return Samples(data.samples, data.source, data.synthetic)
    if calibration is not None and not calibration.synthetic:
        return Samples(calibration.samples[:count], f"{calibration.source} (calibration data)", False)
    return Samples([synthesize(bound, seed=seed + i) for i in range(count)],
                   f"{count} synthesized input(s) (seed {seed})", True)


@dataclass
class Gate:
    """Reference outputs for the samples, and a judge for candidate models."""

    bound: Model
    samples: Samples
    spec: GateSpec
    candidate_target: Target = CPU
    #: Only AMP's ``locate`` uses it; None elsewhere is fine.
    find_divergence: DivergenceFinder | None = None
    reference: list[dict[str, np.ndarray]] = field(default_factory=list)
    #: Index of a sample the last judged candidate failed on (for the divergence search).
    failing_sample: int = 0

    def __post_init__(self):
        self.reference = _run_each(self.bound, CPU, self.samples.feeds)

    def judge_file(self, path: Path) -> GateResult:
        """The model saved at ``path`` on the candidate target, judged against the reference."""
        outputs = _run_each(model_at(path, self.bound), self.candidate_target, self.samples.feeds)
        return self._verdict(outputs)

    def judge_proto(self, proto: onnx.ModelProto) -> GateResult:
        """``proto`` (saved to a temporary file first) on the candidate target, judged against the reference."""
        with tempfile.TemporaryDirectory(prefix="onnxaccel-gate-") as tmp:
            path = Path(tmp) / "candidate.onnx"
            onnx.save_model(proto, str(path), save_as_external_data=proto.ByteSize() > 1_800_000_000)
            return self.judge_file(path)

    def judge_target(self, path: Path, target: Target) -> GateResult:
        """The saved model on a target that converts precision itself (migraphx/fp16, tensorrt/int8...)."""
        return self._verdict(_run_each(model_at(path, self.bound), target, self.samples.feeds))

    def locate(self, fp32: onnx.ModelProto, keep: set[str]) -> tuple[str | None, str]:
        """The first node whose FP16 output diverges, with ``keep`` held in FP32 (via model metadata)."""
        tagged = onnx.ModelProto()
        tagged.CopyFrom(fp32)
        set_keep_fp32_nodes(tagged, keep)
        with tempfile.TemporaryDirectory(prefix="onnxaccel-amp-") as tmp:
            path = Path(tmp) / "amp.onnx"
            onnx.save_model(tagged, str(path), save_as_external_data=tagged.ByteSize() > 1_800_000_000)
            result = need_finder(self.find_divergence)(
                model_at(path, self.bound), CPU, self._fp16_target(),
                self.samples.feeds[self.failing_sample], atol=self.spec.atol, rtol=self.spec.rtol)
        return (result.node if result.found else None), result.message

    def _fp16_target(self) -> Target:
        """Where FP16 is searched: the candidate's device when the model is converted for it (cpu, cuda,
        rocm); the CPU for providers whose fp16 is their own switch (migraphx, tensorrt), which would
        bypass the block list."""
        device = self.candidate_target
        if device.device in ("cpu", "cuda", "rocm"):
            return device.with_precision("fp16")
        return CPU.with_precision("fp16")

    def _verdict(self, outputs: list[dict[str, np.ndarray]]) -> GateResult:
        kw = dict(atol=self.spec.atol, rtol=self.spec.rtol, topk=max(self.spec.topk, 1))
        result = evaluate(compare_outputs(join(self.reference), join(outputs), **kw), self.spec)
        if not result.passed:
            for i, (ref, cand) in enumerate(zip(self.reference, outputs, strict=True)):
                if not evaluate(compare_outputs(ref, cand, **kw), dataclasses.replace(self.spec, min_topk_agreement=None)
                                ).passed:
                    self.failing_sample = i
                    break
        return result


def _run_each(model: Model, target: Target, samples: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    runner = compile_model(*prepare_for_target(model, target))
    try:
        return [runner.run(feeds) for feeds in samples]
    finally:
        runner.close()
