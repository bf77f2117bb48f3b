"""The last part of ``optimize``: provider-native precision, the accuracy verdict, compile timings, and the
target string to run the result with."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from onnxaccel import providers
from onnxaccel.engines.ort import probe_provider
from onnxaccel.errors import OnnxAccelError
from onnxaccel.target import Target, parse_target
from onnxaccel.transform.cached_compile import compile_cached
from onnxaccel.transform.calibration_table import compute_ranges, write_table
from onnxaccel.transform.compile_cache import KEY_FILE, cache_kind
from onnxaccel.transform.evaluate import model_at
from onnxaccel.transform.report import OptimizeReport


@functools.lru_cache(maxsize=16)
def loads_here(target: Target) -> bool:
    """True when an ONNX Runtime session on ``target`` really gets its provider on this machine."""
    if target.engine != "ort":
        return False
    if target.device == "cpu":
        return True

    try:
        return probe_provider(target) is None
    except OnnxAccelError:
        return False


def native_precision(proto, options, calibration, report: OptimizeReport) -> None:
    """Leave FP16/INT8 to the provider: the model stays FP32; INT8 gets a calibration table beside it."""
    target = options.target.with_precision(options.precision)
    if options.int8:
        ranges = compute_ranges(proto, calibration, options.int8.method)
        folder = Path(options.output).with_suffix(".calibration")
        table = write_table(ranges, folder, target, native=options.native_table_format == "tensorrt")
        report.precision["calibration_table"] = table.to_dict()
        target = target.with_options(table.options)
        report.notes.append(
            "The MIGraphX EP hands the table's values to migraphx::quantize_int8 as calibration parameters "
            "(migraphx_execution_provider.cc); the accuracy of that path is measured only on an AMD GPU. The QDQ "
            "model (`--int8 static` without --native) carries its scales in the graph and is gated here."
            if target.device == "migraphx" else
            "TensorRT reads the table as per-tensor dynamic ranges; the provider options that load it: "
            + ", ".join(f"{k}={v}" for k, v in table.options.items()) + ".")
    report.run_with = str(target)


def accuracy_and_timing(report: OptimizeReport, gate, output: Path, options) -> None:
    """Judge the saved model (or the provider's own precision), then time a cold and a warm compile."""
    target = options.target
    engine_target = dataclasses.replace(target, precision="fp32")
    if report.run_with is None:
        qdq_on_migraphx = target.device == "migraphx" and options.int8 is not None
        report.run_with = str(dataclasses.replace(target, precision="int8") if qdq_on_migraphx else engine_target)
    accuracy = {"samples": gate.samples.to_dict(), "spec": gate.spec.to_dict(), "reference": "original model, "
                f"fp32, {providers.get('cpu').provider}", "candidate_target": str(gate.candidate_target)}
    if gate.samples.synthetic:
        accuracy["samples_note"] = ("synthesized inputs exercise every output but not the input distribution "
                                    "the model was trained on; give --eval-data for a meaningful check")
    native_target = None
    if options.native:
        native_target = parse_target(report.run_with)
    if native_target is not None and not loads_here(dataclasses.replace(native_target, precision="fp32")):
        gate.spec = options.graph_gate  # the model is the FP32 graph: judge it as FP32
        accuracy["spec"] = gate.spec.to_dict()
        result = gate.judge_file(output)
        accuracy["status"] = "graph-only"
        accuracy["note"] = (f"{native_target.device} does not load here, so the provider's "
                            f"{options.precision.upper()} was not measured; the gate checked the FP32 graph changes "
                            f"only. On the target machine run: onnxaccel compare {output} --target "
                            f"'{report.run_with}'")
        report.warnings.append(accuracy["note"])
    elif native_target is not None:
        result = gate.judge_target(output, native_target)
        accuracy["status"] = "measured"
        accuracy["candidate_target"] = str(native_target)
    else:
        result = gate.judge_file(output)
        accuracy["status"] = "measured"
    accuracy.update(result.to_dict())
    spec = gate.spec
    if not spec.elementwise and spec.max_error is None and spec.min_topk_agreement is None:
        report.notes.append("INT8 has no elementwise tolerance by default (quantization noise exceeds any that "
                            "would catch real bugs): the gate checked new NaN/Inf"
                            + (f" and cosine similarity >= {spec.min_cosine:g}" if spec.min_cosine is not None else "")
                            + "; pass --min-topk-agreement (classifiers) or --max-error to gate on accuracy")
    report.accuracy = accuracy
    report.passed = result.passed
    if options.compile_cache:
        report.compile = compile_timings(output, gate, native_target or engine_target)


def compile_timings(output: Path, gate, target: Target) -> dict:
    """First compile and warm start of the saved model on ``target`` through the compile cache."""
    probe = dataclasses.replace(target, precision="fp32")
    if not loads_here(probe):
        return {"status": "not-run", "target": str(target),
                "note": f"{target} does not load here; measure on the target machine with "
                        f"`onnxaccel cache warm {output} --target '{target}'`"}
    if cache_kind(target) is None:
        return {"status": "not-run", "target": str(target), "note": f"{target} has no compile cache in onnxaccel"}
    model = model_at(output, gate.bound)
    feeds = gate.samples.feeds[0]
    first_runner, first = compile_cached(model, target, feeds=feeds)
    first_runner.close()
    warm_runner, warm = compile_cached(model, target, feeds=feeds, key=first.key)
    warm_runner.close()
    record_first = first.seconds
    if first.hit:
        import json

        recorded = json.loads((first.key.entry / KEY_FILE).read_text()).get("first_compile_seconds")
        record_first = recorded if recorded is not None else first.seconds
    return {"status": "measured", "target": str(target), "entry": str(first.key.entry),
            "first_compile_seconds": record_first, "first_was_cached": first.hit,
            "warm_start_seconds": warm.seconds, "warm_hit": warm.hit,
            "includes": "session creation + first run", "key": first.key.to_dict(), "uncached": first.uncached}
