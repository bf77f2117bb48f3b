"""Issue 2 on a GPU: `onnxaccel run zoo:resnet50 --target cuda` through both paths, the CUDA provider's own
list of option keys against ours, and the real error texts of failure cases.

Run on the GPU machine (onnxruntime-gpu installed):  python benchmarks/history/gpu_foundation.py OUT_DIR
Writes OUT_DIR/gpu_foundation.json and prints a summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def cli(*args: str) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", *args, "--json"], capture_output=True,
                          text=True, timeout=900)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        data = {"stdout": proc.stdout[-2000:]}
    return {"args": list(args), "rc": proc.returncode, "wall_s": time.perf_counter() - start, "result": data,
            "stderr": proc.stderr[-3000:]}


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort

    from onnxaccel import load_model
    from onnxaccel.engines import compile_model
    from onnxaccel.target import PROVIDER_OPTIONS, parse_target

    report: dict = {"onnxruntime": ort.__version__, "available": ort.get_available_providers()}
    report["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                           "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    runner = compile_model(load_model("zoo:resnet50").bind(batch=1), parse_target("cuda"))
    effective = runner.effective_provider_options()
    report["cuda_option_keys_runtime"] = sorted(effective)
    report["cuda_option_keys_missing_from_table"] = sorted(set(effective) - set(PROVIDER_OPTIONS["cuda"]))
    report["cuda_option_keys_unknown_to_runtime"] = sorted(set(PROVIDER_OPTIONS["cuda"]) - set(effective))
    runner.close()
    report["runs"] = [
        cli("run", "zoo:resnet50", "--target", "cuda"),
        cli("run", "zoo:resnet50", "--target", "cuda", "--no-iobinding"),
        cli("run", "zoo:resnet50", "--target", "cuda/fp16"),
        cli("run", "zoo:resnet50", "--target", "auto"),
        cli("run", "zoo:bert-base", "--target", "cuda", "--batch", "1"),
    ]
    report["bench"] = [
        cli("bench", "zoo:resnet50", "-t", "cuda", "-b", "1", "--runs", "200"),
        cli("bench", "zoo:resnet50", "-t", "cuda", "-b", "1", "--runs", "200", "--no-iobinding"),
        cli("bench", "zoo:resnet50", "-t", "cuda", "-b", "32", "--runs", "50"),
        cli("bench", "zoo:resnet50", "-t", "cuda", "-b", "32", "--runs", "50", "--no-iobinding"),
        cli("bench", "zoo:resnet50", "-t", "cuda/fp16", "-b", "32", "--runs", "50"),
    ]
    report["errors"] = [
        cli("run", "zoo:squeezenet", "--target", "cuda:7"),
        cli("run", "zoo:squeezenet", "--target", "tensorrt"),
        cli("run", "zoo:squeezenet", "--target", "migraphx"),
    ]
    (out / "gpu_foundation.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({
        "onnxruntime": report["onnxruntime"], "gpu": report["nvidia_smi"],
        "option_keys_missing_from_table": report["cuda_option_keys_missing_from_table"],
        "option_keys_unknown_to_runtime": report["cuda_option_keys_unknown_to_runtime"],
        "runs": [(r["args"], r["rc"], r["result"].get("providers"), r["result"].get("placement", {}).get("summary"),
                  r["result"].get("message")) for r in report["runs"]],
        "bench": [(r["args"], r["rc"], r["result"].get("latency", {}).get("p50_ms"),
                   r["result"].get("throughput_items_per_s"), r["result"].get("compile_seconds"),
                   r["result"].get("first_run_ms")) for r in report["bench"]],
        "errors": [(r["args"], r["rc"], r["result"].get("message"), r["result"].get("hint")) for r in report["errors"]],
    }, indent=1, default=str))


if __name__ == "__main__":
    os.environ.setdefault("ONNXACCEL_CACHE_DIR", "/tmp/onnxaccel-cache")
    main()
