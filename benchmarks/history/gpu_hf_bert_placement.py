"""Issue 4 on the H200: the Hugging Face BERT export of research/h200-anchors, whose fused FP16 form puts a
node on the CPU, inserts a Memcpy and makes ONNX Runtime refuse CUDA graphs. Does `onnxaccel inspect` show
exactly that, and name the node?

Needs torch + transformers (the GPU image has them) and onnxruntime-gpu. Prints one JSON document.
Usage: python benchmarks/history/gpu_hf_bert_placement.py OUT_DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def export(out: Path) -> dict[str, Path]:
    import onnx
    import torch
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import BertConfig, BertModel

    cfg = BertConfig()
    model = BertModel(cfg).eval()

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            o = self.inner(input_ids=input_ids, attention_mask=attention_mask)
            return o.last_hidden_state, o.pooler_output

    plain = out / "hf_bert.onnx"
    ids = torch.randint(0, cfg.vocab_size, (1, 128))
    mask = torch.ones(1, 128, dtype=torch.int64)
    torch.onnx.export(Wrapper(model), (ids, mask), str(plain), input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state", "pooler_output"],
                      dynamic_axes={"input_ids": {0: "B", 1: "S"}, "attention_mask": {0: "B", 1: "S"},
                                    "last_hidden_state": {0: "B", 1: "S"}, "pooler_output": {0: "B"}},
                      opset_version=17, dynamo=False)
    proto = onnx.load(str(plain))
    proto.ir_version = min(proto.ir_version, 8)
    onnx.save(proto, str(plain))
    fp16 = out / "hf_bert_fp16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(plain)), keep_io_types=True), str(fp16))
    fused = out / "hf_bert_fused_fp16.onnx"
    opt = optimize_model(str(plain), model_type="bert", num_heads=12, hidden_size=768)
    opt.convert_float_to_float16(keep_io_types=True)
    opt.save_model_to_file(str(fused))
    return {"plain": plain, "fp16": fp16, "fused_fp16": fused}


def inspect(path: Path, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "onnxaccel.cli.main", "inspect", str(path), "--target", "cuda",
                           "--shape", "input_ids=1x128", "--shape", "attention_mask=1x128", *extra, "--json"],
                          capture_output=True, text=True, timeout=600)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"rc": proc.returncode, "stdout": proc.stdout[-1500:], "stderr": proc.stderr[-1500:]}
    placement = data.get("placement") or {}
    return {"rc": proc.returncode, "summary": placement.get("summary"), "fallback": placement.get("fallback"),
            "memcpy_nodes": placement.get("memcpy_nodes"), "copies": placement.get("copies"),
            "graph_capture": placement.get("graph_capture"), "stderr": proc.stderr[-600:]}


def ort_accepts_cuda_graph(path: Path) -> dict:
    import onnxruntime as ort

    try:
        ort.InferenceSession(str(path), providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
        return {"accepted": True}
    except Exception as exc:  # noqa: BLE001 - the refusal is the measurement
        return {"accepted": False, "error": str(exc)[-400:]}


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/hf-bert")
    out.mkdir(parents=True, exist_ok=True)
    paths = export(out)
    report = {name: {"inspect": inspect(p), "ort_enable_cuda_graph": ort_accepts_cuda_graph(p)}
              for name, p in paths.items()}
    report["fused_fp16"]["inspect_strict_rc"] = inspect(paths["fused_fp16"], "--strict")["rc"]
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
