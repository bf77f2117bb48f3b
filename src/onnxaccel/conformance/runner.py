"""Run ONNX test cases on a target and compare every output with the expected one.

Each case goes through the pipeline every command uses: load the model, bind its shapes from the data
set's inputs (``inputs.load_feeds`` with ``NAME=input_K.pb`` items), convert precision when the provider
cannot (``precision.prepare_for_target``) and compile once (``engines.compile_model``); every data
set of the case then runs on that runner.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx

from onnxaccel.compare.tolerance import OutputCheck, TolerancePolicy, compare_value
from onnxaccel.conformance.cases import TestCase
from onnxaccel.conformance.result import CaseResult, CheckReport
from onnxaccel.errors import InputError, OnnxAccelError
from onnxaccel.inputs import load_feeds
from onnxaccel.model import Model, load_model
from onnxaccel.pipeline import Prepared, prepare
from onnxaccel.protobuf_values import read_pb, write_pb
from onnxaccel.target import Target


def run_check(
    cases: Sequence[TestCase],
    target: Target,
    *,
    policy: TolerancePolicy | None = None,
    keep_going: bool = True,
    strict: bool = False,
    on_case: Callable[[CaseResult], None] | None = None,
) -> CheckReport:
    """Run every case on ``target``; ``on_case`` is called after each (for progress). Without ``keep_going``
    the run stops at the first failure or error."""
    policy = policy or TolerancePolicy(precision=target.precision)
    report = CheckReport(target=str(target), precision=target.precision,
                         tolerance={"precision": policy.precision, "rtol": policy.rtol, "atol": policy.atol})
    if target.precision == "fp16" and not target.precision_is_native:
        report.notes.append(f"{target.device} has no FP16 switch of its own: each model was converted to FP16 "
                            "(FP32 inputs and outputs kept) before it ran, as `run -p fp16` does")
    start = time.perf_counter()
    for case in cases:
        result = run_case(case, target, policy, strict=strict)
        report.cases.append(result)
        if on_case is not None:
            on_case(result)
        if not keep_going and result.status in ("fail", "error"):
            break
    report.seconds = time.perf_counter() - start
    return report


def run_case(case: TestCase, target: Target, policy: TolerancePolicy, *, strict: bool = False) -> CaseResult:
    """Run one case; never raises for a problem of the case (that is its result)."""
    result = CaseResult(case.name, str(case.folder), "skipped", reason=case.skip)
    if case.skip or case.model is None:
        return result
    start = time.perf_counter()
    prepared: Prepared | None = None
    try:
        model = load_model(case.model)
        case_policy = policy.for_case(case.rtol, case.atol)
        with tempfile.TemporaryDirectory(prefix="onnxaccel-check-") as tmp:
            for data_set in case.data_sets:
                items = _input_items(model, case, data_set.inputs, Path(tmp))
                if prepared is None:
                    prepared = prepare(model, target, inputs=items, strict=strict)
                    feeds = prepared.feeds
                    result.providers = list(prepared.runner.providers)
                    result.warnings = list(prepared.warnings)
                else:
                    bound, feeds = load_feeds(model, items)
                    if target.engine != "ort" and dict(bound.input_shapes) != dict(prepared.model.input_shapes):
                        prepared.close()  # a program compiled for fixed shapes: compile again for these
                        prepared = prepare(model, target, inputs=items, strict=strict)
                        feeds = prepared.feeds
                actual = prepared.runner.run(feeds)
                result.outputs.extend(_compare(model, data_set.name, data_set.outputs, actual, case_policy,
                                               len(case.data_sets) > 1))
                result.data_sets += 1
        result.status = "pass" if all(o.passed for o in result.outputs) else "fail"
        if result.status == "fail" and target.precision == "fp16" and _nonfinite_failure(result.outputs):
            result.hint = _fp16_overflow_hint(case, target)
    except OnnxAccelError as exc:
        result.status, result.error, result.hint = "error", f"{type(exc).__name__}: {exc.message}", exc.hint
    except Exception as exc:  # noqa: BLE001 - a bug of ours: one case's result, not the end of the run
        result.status = "error"
        result.error = f"internal error: {type(exc).__name__}: {exc}"
        result.hint = "This is a bug in onnxaccel; rerun the case alone with --debug and report the traceback."
    finally:
        if prepared is not None:
            prepared.close()
    result.seconds = time.perf_counter() - start
    return result


def _nonfinite_failure(outputs) -> bool:
    """Whether an output failed on NaN/Inf values where finite ones were expected."""
    return any(not o.passed and o.reason and "NaN/Inf" in o.reason for o in outputs)


def _fp16_overflow_hint(case: TestCase, target: Target) -> str:
    """NaN/Inf at FP16 where FP32 is finite is almost always float16 overflow (|x| > 65504) inside the model:
    ONNX's 'real' classifiers carry random weights whose FP32 activations reach 1e10-1e31
    (benchmarks/fp16_overflow_probe.py, docs/CONFORMANCE.md)."""
    device = str(target).split("/")[0]
    return (f"NaN/Inf at FP16 where the expected values are finite: float16 overflows above 65504 (and flushes "
            f"values below 6e-8 to 0, so x/x turns NaN). Find the first "
            f"node that overflows with `onnxaccel compare CASE/model.onnx -t {device} -p fp16 --bisect` and keep it "
            "in FP32 (`optimize --fp16 --keep-fp32 NODE`), or let `onnxaccel optimize --amp` choose the FP32 nodes.")


def _input_items(model: Model, case: TestCase, files: Sequence[Path], tmp: Path) -> list[str]:
    """``NAME=FILE`` items: input_K.pb goes to the graph's K-th input, as ONNX's runner reads it
    (onnx/backend/test/runner/__init__.py, ``model.graph.input[i].type``, release 1.23.0)."""
    graph_inputs = list(model.proto.graph.input)
    if case.generated_inputs == "arange":
        return [f"{name}={write_pb(tmp / f'{name_index}.pb', value, name)}"
                for name_index, (name, value) in enumerate(_arange_inputs(model.proto).items())]
    if len(files) > len(graph_inputs):
        raise InputError(f"{case.name}: {len(files)} input files for a graph of {len(graph_inputs)} inputs.",
                         "input_K.pb must follow the order of the graph's inputs (onnx's generate_data layout).")
    return [f"{graph_inputs[k].name}={path}" for k, path in enumerate(files)]


def _arange_inputs(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """ONNX's inputs for its light models: ``arange(n).reshape(shape) / n`` as float32, a dim without a value
    taken as 1 (onnx/backend/test/runner/__init__.py ``generate_dummy_data(random=False)``, release 1.23.0)."""
    initializers = {t.name for t in proto.graph.initializer}
    feeds = {}
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims)
        n = int(np.prod(shape))
        feeds[value.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


def _compare(model: Model, data_set: str, files: Sequence[Path], actual: dict, policy: TolerancePolicy,
             label_set: bool) -> list[OutputCheck]:
    graph_outputs = list(model.proto.graph.output)
    if len(files) > len(graph_outputs):
        raise InputError(f"{data_set}: {len(files)} expected outputs for a graph of {len(graph_outputs)} outputs.",
                         "output_K.pb must follow the order of the graph's outputs.")
    checks = []
    for k, path in enumerate(files):
        spec = graph_outputs[k]
        expected = read_pb(path, spec.type)
        label = f"{data_set}/{spec.name}" if label_set else spec.name
        if spec.name not in actual:
            raise InputError(f"The runner returned no output '{spec.name}'.", "Check the model's outputs.")
        checks.extend(compare_value(label, expected, actual[spec.name], policy))
    return checks
