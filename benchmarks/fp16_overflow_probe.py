"""Where an FP16 model's outputs turn NaN/Inf: every intermediate tensor of the FP16 model (as `-p fp16` converts
it for the target's provider) next to the same tensor of the FP32 model, for ONNX's test cases.

    python benchmarks/fp16_overflow_probe.py -t cuda CASE_DIR... [--out OUT.json]

For each case: the first node (graph order) whose FP16 output has NaN/Inf while the FP32 one is finite, its op,
the largest FP32 magnitude of that tensor (above 65504, the float16 maximum, means overflow) and of every
tensor. Issue 17: `check -t cuda -p fp16` gave NaN softmax outputs for 6 classifiers that pass at FP16 on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx

FP16_MAX = 65504.0


def _all_outputs(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, list[tuple[str, str, str]]]:
    """A copy whose graph outputs are every node output of the main graph; [(tensor, node, op)] in order."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    known = {o.name for o in model.graph.output}
    order = []
    for node in model.graph.node:
        for name in node.output:
            if name:
                order.append((name, node.name, node.op_type))
                if name not in known:
                    model.graph.output.add(name=name)  # untyped: ORT accepts value names without types
                    known.add(name)
    return model, order


def probe(case: Path, target: str) -> dict:
    import onnxruntime as ort

    from onnxaccel.conformance import discover
    from onnxaccel.conformance.runner import _arange_inputs
    from onnxaccel.protobuf_values import read_pb
    from onnxaccel.model import load_model
    from onnxaccel.target import parse_target
    from onnxaccel.precision.variant import to_fp16

    tgt = parse_target(target)
    found = discover([case])[0]
    fp32 = load_model(str(found.model))
    if found.generated_inputs == "arange":
        feeds = _arange_inputs(fp32.proto)
    else:
        types = {v.name: v.type for v in fp32.proto.graph.input}
        names = [v.name for v in fp32.proto.graph.input if v.name not in {t.name for t in fp32.proto.graph.initializer}]
        feeds = {name: read_pb(path, types[name]) for name, path in zip(names, found.data_sets[0].inputs)}
    fp16 = to_fp16(fp32, provider=tgt.provider)
    results = {}
    for label, model, providers in (("fp32", fp32, ["CPUExecutionProvider"]),
                                    ("fp16", fp16, [tgt.provider, "CPUExecutionProvider"])):
        expanded, order = _all_outputs(model.proto)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every tensor
        session = ort.InferenceSession(expanded.SerializeToString(), so, providers=providers)
        names = [o.name for o in session.get_outputs()]
        values = dict(zip(names, session.run(None, feeds)))
        results[label] = (values, order, session.get_providers())
    f32, order32, _ = results["fp32"]
    f16, order16, providers = results["fp16"]
    first = None
    biggest = []
    for tensor, node, op in order32:
        a = f32.get(tensor)
        if not isinstance(a, np.ndarray) or a.dtype.kind != "f" or not a.size:
            continue
        peak = float(np.nanmax(np.abs(a)))
        biggest.append((peak, tensor, op))
        b = f16.get(tensor)
        if first is None and isinstance(b, np.ndarray) and b.dtype.kind == "f" and np.isfinite(a).all() \
                and not np.isfinite(b.astype(np.float32)).all():
            first = {"tensor": tensor, "node": node, "op": op, "fp32_max_abs": peak,
                     "fp16_nonfinite": int((~np.isfinite(b.astype(np.float32))).sum()), "size": int(b.size)}
    biggest.sort(reverse=True)
    return {"case": str(case), "providers": providers, "first_nonfinite": first,
            "fp32_largest": [{"max_abs": p, "tensor": t, "op": o} for p, t, o in biggest[:5]],
            "fp32_over_fp16_max": sum(p > FP16_MAX for p, _, _ in biggest),
            "input_ranges": {k: [float(np.min(v)), float(np.max(v))] for k, v in feeds.items()
                             if isinstance(v, np.ndarray) and v.dtype.kind == "f"}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--target", "-t", default="cuda")
    parser.add_argument("--out")
    args = parser.parse_args()
    report = []
    for case in args.cases:
        try:
            report.append(probe(Path(case), args.target))
        except Exception as exc:  # noqa: BLE001 - a probe report, one line per case
            report.append({"case": case, "error": f"{type(exc).__name__}: {exc}"[:500]})
        print(json.dumps(report[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
