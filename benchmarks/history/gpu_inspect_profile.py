"""Issue 4 on an NVIDIA GPU: placement, graph-capture verdicts, profiles and FP32/FP16 comparisons.

Run on the GPU machine (onnxruntime-gpu 1.31.1, onnxaccel installed editable):

    python benchmarks/history/gpu_inspect_profile.py [OUT_DIR] > gpu_inspect_profile.json

Prints one JSON document. OUT_DIR (default: a temporary folder) receives the Chrome traces. Each section
records its own error instead of stopping the script. What it checks:

* zoo:bert-base on cuda: the node ONNX Runtime places on the CPU is named, with the Memcpy nodes it causes,
  and the CUDA-graph verdict agrees with what ONNX Runtime does when enable_cuda_graph=1 is asked for.
* zoo:resnet50 on cuda: the same, where everything should run on CUDA and capture should work.
* `inspect --strict` exits 1 on BERT's fallback.
* profile top-10 (op types and nodes) of resnet50 and bert-base on cuda; whether the wheel's profiler emits
  GPU kernel events; nsys kernel statistics when nsys is on PATH.
* compare cuda vs cuda/fp16 on resnet50 and bert-base, cpu vs cuda at fp32 (TF32 is on by default), and a
  model whose FP16 arithmetic overflows, bisected to the node.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def section(func):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            result = func(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - record and go on
            result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        result["wall_s"] = round(time.perf_counter() - start, 2)
        return result
    return wrapper


def ort_refuses_capture(model: str, target: str) -> dict:
    """Build a session with graph capture on: does ONNX Runtime accept it? (the ground truth for the verdict)."""
    from onnxaccel.errors import OnnxAccelError
    from onnxaccel.pipeline import prepare
    from onnxaccel.target import parse_target

    try:
        prepared = prepare(model, parse_target(target))
    except OnnxAccelError as exc:
        return {"accepted": False, "message": exc.message, "details": (exc.details or "")[-1500:]}
    try:
        bound = prepared.runner.bind(prepared.feeds)
        for _ in range(3):  # capture happens on the first runs
            bound.run()
        return {"accepted": True}
    except OnnxAccelError as exc:
        return {"accepted": False, "at": "run", "message": exc.message}
    finally:
        prepared.close()


@section
def placement(model: str) -> dict:
    from onnxaccel.analysis.inspect import inspect_model
    from onnxaccel.pipeline import prepare
    from onnxaccel.target import parse_target

    result = inspect_model(model, parse_target("cuda"))
    report = result.placement.to_dict()
    # What get_provider_graph_assignment_info itself lists besides CUDA nodes (are Memcpy nodes in it?).
    prepared = prepare(model, parse_target("cuda"))
    raw = [{"ep": sg.ep_name, "nodes": [(n.op_type, n.name) for n in sg.get_nodes()]}
           for sg in prepared.runner.session.get_provider_graph_assignment_info()]
    prepared.close()
    non_cuda = [r for r in raw if r["ep"] != "CUDAExecutionProvider"]
    memcpy_in_info = [n for r in raw for n in r["nodes"] if n[0].startswith("Memcpy")]
    truth = ort_refuses_capture(model, "cuda?enable_cuda_graph=1")
    verdict = report["graph_capture"]["possible"]
    return {"placement": report, "warnings": result.warnings, "assignment_info_non_cuda": non_cuda,
            "assignment_info_memcpy_nodes": memcpy_in_info, "subgraphs_in_assignment_info": len(raw),
            "ort_with_enable_cuda_graph": truth, "verdict_matches_ort": verdict == truth["accepted"]}


@section
def strict_cli(model: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", "inspect", model, "--target", "cuda",
                           "--strict", "-n", "0"], capture_output=True, text=True, timeout=900)
    return {"rc": proc.returncode, "stdout_tail": proc.stdout[-2500:], "stderr_tail": proc.stderr[-1500:]}


@section
def profile(model: str, out: Path, batch: int) -> dict:
    from onnxaccel.analysis.profile import profile_model
    from onnxaccel.target import parse_target

    trace = out / f"{model.replace('zoo:', '')}_cuda_b{batch}_trace.json"
    result = profile_model(model, parse_target("cuda"), runs=50, warmup=10, trace=trace, batch=batch)
    d = result.to_dict()
    return {"run_ms": d["run_ms"], "node_total_ms_per_run": d["node_total_ms_per_run"],
            "node_count": d["node_count"], "top_ops": d["ops"][:10], "top_nodes": d["nodes"][:10],
            "device_kernel_events": len(d["kernels"]), "top_kernels": d["kernels"][:10], "notes": d["notes"],
            "trace": d["trace"], "trace_bytes": trace.stat().st_size}


@section
def kernels_nsys(model: str) -> dict:
    if not shutil.which("nsys"):
        return {"skipped": "nsys is not on PATH"}
    from onnxaccel.analysis.kernels import run_kernel_profile
    from onnxaccel.target import parse_target

    report = run_kernel_profile("nsys", model, parse_target("cuda"), runs=20, warmup=5, batch=1)
    d = report.to_dict()
    return {**{k: v for k, v in d.items() if k != "kernels"}, "top_kernels": d["kernels"][:10]}


@section
def compare(model: str, reference: str, candidate: str, *, bisect: bool = False, **shape) -> dict:
    from onnxaccel.analysis.compare import compare_targets
    from onnxaccel.compare import default_tolerances
    from onnxaccel.target import parse_target

    ref, cand = parse_target(reference), parse_target(candidate)
    atol, rtol = default_tolerances(ref, cand)
    c = compare_targets(model, ref, cand, atol=atol, rtol=rtol, **shape)
    d = c.to_dict()
    out = {"passed": d["passed"], "atol": atol, "rtol": rtol, "notes": d["notes"],
           "outputs": [{k: o[k] for k in ("name", "max_abs", "mean_abs", "rel_l2", "cosine", "nan", "inf",
                                          "mismatched", "size", "required_atol", "topk", "reason")}
                       for o in d["outputs"]],
           "placement": [d["reference"]["placement"]["summary"], d["candidate"]["placement"]["summary"]]}
    if bisect and not c.result.passed:
        from onnxaccel.analysis.bisect import find_divergence

        start = time.perf_counter()
        div = find_divergence(c.bound_model, ref, cand, c.feeds, atol=atol, rtol=rtol)
        out["bisect"] = {k: v for k, v in div.to_dict().items() if k not in ("checked",)}
        out["bisect"]["wall_s"] = round(time.perf_counter() - start, 2)
    return out


def overflow_model(path: Path) -> Path:
    """y = (relu(x) * 300 * 300 - 45000) * 1e-4: finite in FP32 (|y| <= 4.5); in FP16 arithmetic the second
    product exceeds 65504 for x > 0.73 and becomes Inf. Every constant fits FP16, so only the arithmetic
    overflows (on the CPU, ONNX Runtime computes these ops in FP32 and nothing overflows)."""
    def const(name, value):
        return numpy_helper.from_array(np.array(value, np.float32), name)
    nodes = [
        helper.make_node("Relu", ["x"], ["h"], name="relu_in"),
        helper.make_node("Mul", ["h", "k300"], ["s"], name="scale_1"),
        helper.make_node("Mul", ["s", "k300"], ["big"], name="scale_up"),
        helper.make_node("Sub", ["big", "k45000"], ["centered"], name="center"),
        helper.make_node("Mul", ["centered", "k1e-4"], ["y"], name="scale_down"),
    ]
    graph = helper.make_graph(nodes, "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])],
                              initializer=[const("k300", 300.0), const("k45000", 45000.0), const("k1e-4", 1e-4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="onnxaccel-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    overflow = str(overflow_model(out / "fp16_overflow.onnx"))
    report = {
        "onnxruntime": ort.__version__, "available_providers": ort.get_available_providers(),
        "gpu": smi.stdout.strip(), "out_dir": str(out),
        "placement_bert_base_cuda": placement("zoo:bert-base"),
        "placement_resnet50_cuda": placement("zoo:resnet50"),
        "inspect_strict_bert_base_cuda": strict_cli("zoo:bert-base"),
        "profile_resnet50_cuda_b1": profile("zoo:resnet50", out, 1),
        "profile_resnet50_cuda_b32": profile("zoo:resnet50", out, 32),
        "profile_bert_base_cuda_b1": profile("zoo:bert-base", out, 1),
        "kernels_nsys_resnet50_cuda": kernels_nsys("zoo:resnet50"),
        "compare_resnet50_cuda_fp32_vs_fp16": compare("zoo:resnet50", "cuda", "cuda/fp16", batch=8),
        "compare_resnet50_cpu_vs_cuda_fp32": compare("zoo:resnet50", "cpu", "cuda", batch=8),
        "compare_bert_base_cuda_fp32_vs_fp16": compare("zoo:bert-base", "cuda", "cuda/fp16", bisect=True),
        "compare_overflow_cuda_fp32_vs_fp16": compare(overflow, "cuda", "cuda/fp16", bisect=True),
    }
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
