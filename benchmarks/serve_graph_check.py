"""Does a server replaying CUDA graphs answer like a plain in-process session? (GPU machine only.)

Starts ``onnxaccel serve zoo:resnet50 --target 'cuda:0?enable_cuda_graph=1' --precision fp16 --workers 2
--shared-models --instances 2 --max-batch 64``, sends 48 different images concurrently (JSON tensors, so the
check does not depend on the binary path), and compares every answer with a plain FP16 session of the same
model run in this process on the same image: the top-1 class must agree and logits stay within FP16 noise.
Different images must get different answers (a graph replaying stale inputs would give one answer to all).
Reports how many batches were joined on the host and how many copied in (with --shared-models and graph
capture, requests are copied from the workers' page-locked shared memory straight to the GPU: then none is
joined on the host). With ``--serve-args "--streams M"`` the server's lines about streams are kept, and the
check fails where the server dropped the mode (it did not run what was asked).

Prints one JSON object. Usage: python benchmarks/serve_graph_check.py [--target T] [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time

import httpx
import numpy as np

from onnxaccel.pipeline import prepare
from onnxaccel.loadtest.clients import http_payload
from onnxaccel.target import parse_target

SERVE = ("import typer\nfrom onnxaccel.cli import serve\napp = typer.Typer()\n"
         "app.callback()(lambda: None)\nserve.register(app)\napp()")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="cuda:0?enable_cuda_graph=1")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--port", type=int, default=18600)
    parser.add_argument("--serve-args", default="", help="more serve options, e.g. --no-direct-copy")
    args = parser.parse_args()

    cmd = [sys.executable, "-c", SERVE, "serve", "zoo:resnet50", "--target", args.target, "--precision", "fp16",
           "--workers", "2", "--shared-models", "--instances", "2", "--max-batch", "64", "--max-queue-delay-ms", "5",
           "--http-port", str(args.port), "--no-grpc", *args.serve_args.split()]
    log = open("/tmp/serve_graph_check.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{args.port}"
    result: dict = {"target": args.target}
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"server exited {proc.returncode}: {open('/tmp/serve_graph_check.log').read()[-3000:]}")
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        model = httpx.get(f"{url}/v2/models/resnet50").json()
        name, datatype = model["inputs"][0]["name"], model["inputs"][0]["datatype"]
        reference = "cpu" if parse_target(args.target).device == "cpu" else "cuda:0"
        prepared = prepare("zoo:resnet50", parse_target(reference, precision="fp16"), batch=1)
        rng = np.random.default_rng(0)
        images = rng.standard_normal((args.requests, 3, 224, 224)).astype(
            np.float16 if datatype == "FP16" else np.float32)
        want = np.concatenate([next(iter(prepared.runner.run({name: images[i:i + 1]}).values()))
                               for i in range(args.requests)]).astype(np.float32)

        async def one(client, i):
            payload = http_payload("resnet50", {name: images[i:i + 1]}, binary=False)
            response = await client.post(payload.path, content=payload.body, headers=dict(payload.headers))
            out = response.json()["outputs"][0]
            return np.array(out["data"], dtype=np.float32).reshape(out["shape"])  # JSON numbers

        async def run():
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                return await asyncio.gather(*(one(client, i) for i in range(args.requests)))

        got = np.concatenate(asyncio.run(run()))
        stats = httpx.get(f"{url}/v2/models/resnet50/stats").json()["model_stats"][0]
        phases = {}  # batches per phase: "join" counts batches joined on the host, "copy_in" all copied in
        for line in httpx.get(f"{url}/metrics").text.splitlines():
            if line.startswith("onnxaccel_batch_phase_seconds_count{"):
                phase = line.split('phase="', 1)[1].split('"', 1)[0]
                phases[phase] = phases.get(phase, 0) + int(float(line.rsplit(" ", 1)[1]))
        log_text = open("/tmp/serve_graph_check.log").read()
        asked = args.serve_args.split("--streams", 1)[1].split()[0].lstrip("=") if "--streams" in args.serve_args \
            else None
        streams = [line.strip() for line in log_text.splitlines() if "streams" in line]
        ran_as_asked = asked is None or f"--streams {asked} dropped" not in " ".join(log_text.split())
        diff = np.abs(got.reshape(want.shape) - want)
        top_same = float(np.mean(got.reshape(want.shape).argmax(-1) == want.argmax(-1)))
        distinct = len({g.tobytes() for g in got})  # a replay of stale inputs repeats one answer
        result.update({
            "model": model, "requests": args.requests, "executions": stats["execution_count"],
            "rows": stats["inference_count"], "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
            "top1_agreement": top_same, "distinct_answers": distinct,
            "batches_joined_on_host": phases.get("join", 0), "batches_copied_in": phases.get("copy_in", 0),
            "streams_asked": asked, "streams_log": streams, "streams_ran_as_asked": ran_as_asked,
            "ok": bool(top_same == 1.0 and distinct == args.requests and diff.max() < 0.1 and ran_as_asked)})
        prepared.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        result["server_exit_code"] = proc.wait(90)
        result["server_log_tail"] = open("/tmp/serve_graph_check.log").read()[-1500:]
    sys.stdout.write(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
