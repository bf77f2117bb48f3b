"""Running the accuracy gate: sample inputs, reference outputs, judging a candidate, locating divergence.

The reference is always the original model at FP32 on the CPU provider (the most trustworthy numbers this
machine has); the candidate runs on the requested target when that provider loads here, else on the CPU.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from onnxaccel.inputs import ImagePreprocess, synthesize
from onnxaccel.model import Model
from onnxaccel.target import Target, parse_target
from onnxaccel.transform.accuracy import AccuracyTools, GateResult, GateSpec, evaluate
from onnxaccel.transform.calibration import CalibrationData, load_calibration
from onnxaccel.transform.evaluate import join, model_at
from onnxaccel.transform.fp16 import set_keep_fp32_nodes

CPU = parse_target("cpu")


@dataclass
class Samples:
    feeds: list[dict[str, np.ndarray]]
    source: str
    synthetic: bool

    def to_dict(self) -> dict:
        return {"source": self.source, "count": len(self.feeds), "synthetic": self.synthetic}


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
    tools: AccuracyTools
    candidate_target: Target = CPU
    reference: list[dict[str, np.ndarray]] = field(default_factory=list)
    #: Index of a sample the last judged candidate failed on (for the divergence search).
    failing_sample: int = 0

    def __post_init__(self):
        self.reference = _run_each(self.bound, CPU, self.samples.feeds)

    def judge_file(self, path: Path) -> GateResult:
        outputs = _run_each(model_at(path, self.bound), self.candidate_target, self.samples.feeds)
        return self._verdict(outputs)

    def judge_proto(self, proto: onnx.ModelProto) -> GateResult:
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
            result = self.tools.find_divergence(
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
        compare = self.tools.compare
        kw = dict(atol=self.spec.atol, rtol=self.spec.rtol, topk=max(self.spec.topk, 1))
        result = evaluate(compare(join(self.reference), join(outputs), **kw), self.spec)
        if not result.passed:
            for i, (ref, cand) in enumerate(zip(self.reference, outputs, strict=True)):
                if not evaluate(compare(ref, cand, **kw), dataclasses.replace(self.spec, min_topk_agreement=None)
                                ).passed:
                    self.failing_sample = i
                    break
        return result


def _run_each(model: Model, target: Target, samples: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    from onnxaccel.engines import compile_model
    from onnxaccel.transform.precision import prepare_for_target

    runner = compile_model(*prepare_for_target(model, target))
    try:
        return [runner.run(feeds) for feeds in samples]
    finally:
        runner.close()
