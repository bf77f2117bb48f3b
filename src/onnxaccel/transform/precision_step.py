"""``optimize``'s precision step: FP16 (plain or AMP), INT8 (static QDQ or dynamic), or the provider's own
(``--native``), with what each did recorded in the report's ``precision`` object.

INT8 records how much of the model it reached (:mod:`onnxaccel.transform.int8_coverage`) and warns when that
is little; static INT8 records a fall back to per-tensor weights (:func:`transform.int8.quantize_static_reported`).
"""

from __future__ import annotations

import dataclasses

import onnx

from onnxaccel.model import Model
from onnxaccel.precision.fp16 import convert_fp16_detailed
from onnxaccel.precision.int8 import needs_reduce_range, quantized_node_count
from onnxaccel.transform.amp import auto_mixed_precision
from onnxaccel.transform.gate import Gate
from onnxaccel.transform.gate_report import native_precision
from onnxaccel.transform.int8 import quantize_dynamic_proto, quantize_static_reported
from onnxaccel.transform.int8_coverage import FlopCounter, int8_coverage
from onnxaccel.transform.report import OptimizeReport


def precision_step(proto: onnx.ModelProto, options, calibration, gate: Gate, steps, report: OptimizeReport, *,
                   bound: Model, source: str = "MODEL", count_flops: FlopCounter | None = None) -> onnx.ModelProto:
    """Convert ``proto`` to ``options.precision`` (``steps.run`` times each conversion) and record it in
    ``report.precision``; ``--native`` leaves the model FP32 for the provider to convert."""
    precision = report.precision
    precision["requested"] = options.precision
    precision["native"] = options.native
    if options.native:
        native_precision(proto, options, calibration, report)
        return proto
    provider = fp16_provider(gate)
    if options.amp:
        return _amp(proto, options, gate, steps, precision, provider)
    if options.fp16:
        holder = {}

        def fp16(p):
            holder["result"] = convert_fp16_detailed(p, op_block_list=options.fp16_block_ops,
                                                     node_block_list=options.keep_fp32_nodes, provider=provider)
            return holder["result"].proto

        proto = steps.run("fp16", fp16, proto)
        precision["keep_fp32"] = list(options.keep_fp32_nodes)
        precision["op_block_list"] = list(options.fp16_block_ops)
        precision["fp16"] = holder["result"].to_dict()
    elif options.int8:
        proto = _int8(proto, options, calibration, steps, report, bound=bound, source=source,
                      count_flops=count_flops)
    return proto


def fp16_provider(gate: Gate) -> str | None:
    """The provider FP16 output is probed on for missing kernels: the one the gate judges on (it loads here)."""
    target = gate.candidate_target
    return target.provider if target.engine == "ort" else None


def _amp(proto, options, gate: Gate, steps, precision: dict, provider: str | None) -> onnx.ModelProto:
    blocked_by_op = {n.name for n in proto.graph.node if n.op_type in set(options.fp16_block_ops)}
    fp32 = proto
    holder = {}

    def amp(p):
        result = auto_mixed_precision(p, gate.judge_proto, lambda keep: gate.locate(fp32, keep),
                                      keep_fp32=set(options.keep_fp32_nodes) | blocked_by_op, provider=provider)
        holder["result"] = result
        return result.proto

    proto = steps.run("fp16-amp", amp, proto)
    precision["amp"] = holder["result"].to_dict()
    precision["keep_fp32"] = holder["result"].keep_fp32
    # The final conversion again, for the per-op counts and the automatic FP32 list of the report.
    precision["fp16"] = convert_fp16_detailed(fp32, op_block_list=options.fp16_block_ops,
                                              node_block_list=holder["result"].keep_fp32,
                                              provider=provider).to_dict()
    return proto


def _int8(proto, options, calibration, steps, report: OptimizeReport, *, bound: Model, source: str,
          count_flops: FlopCounter | None) -> onnx.ModelProto:
    settings = options.int8
    if options.target.device in ("tensorrt", "migraphx") and not settings.symmetric_activations:
        settings = dataclasses.replace(settings, symmetric_activations=True)
        report.notes.append("symmetric activation ranges for TensorRT/MIGraphX (TensorRT requires them)")
    before = proto
    if settings.mode == "static":
        holder = {}

        def static(p):
            holder["result"] = quantize_static_reported(p, calibration, settings)
            return holder["result"].proto

        proto = steps.run("int8-static", static, proto)
        if holder["result"].note:
            settings = dataclasses.replace(settings, per_channel=False)
            report.notes.append(holder["result"].note)
    else:
        if settings.reduce_range is None:  # automatic: only where the model runs on this CPU
            reduce = options.target.device == "cpu" and needs_reduce_range()
            settings = dataclasses.replace(settings, reduce_range=reduce)
            if reduce:
                report.notes.append("7-bit INT8 weights (reduce_range): this x86 CPU has no VNNI, where ONNX "
                                    "Runtime's U8S8 integer products can saturate")
        proto = steps.run("int8-dynamic", lambda p: quantize_dynamic_proto(p, settings, source=source), proto)
    precision = report.precision
    precision["int8"] = settings.to_dict()
    precision["quantized_nodes"] = quantized_node_count(proto)
    coverage = int8_coverage(before, proto, bound, count_flops)
    precision["coverage"] = coverage.to_dict()
    if coverage.warning():
        report.warnings.append(coverage.warning())
    return proto
