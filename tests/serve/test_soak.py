"""A bounded soak (about 20 s): a steady stream of requests of changing batch sizes and image widths, with arena
shrinkage on; the server's resident memory stops growing after warm-up (the GPU version of this soak is in
benchmarks/serve_throughput.py --soak, reading GPU memory through the telemetry sampler)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from tests.serve.conftest import ServerProcess, write_config

SOAK_S = 20.0
WARMUP_S = 5.0
ALLOWED_GROWTH = 24 * 1024 * 1024


def test_memory_stays_flat_over_a_soak(tmp_path, pretrained_cls):
    (tmp_path / "cls").mkdir()
    (tmp_path / "cls" / "model.onnx").write_bytes(Path(pretrained_cls).read_bytes())
    write_config(tmp_path / "cls", max_batch=4, max_queue_delay_ms=2, arena_shrinkage=True)
    server = ServerProcess(tmp_path, log=tmp_path / "server.log").wait_ready()
    rng = np.random.default_rng(0)
    bodies = []
    for rows in (1, 2, 3, 4):
        for width in (96, 192, 320):
            x = rng.random((rows, 3, 48, width), dtype=np.float32)
            head = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                           "parameters": {"binary_data_size": x.nbytes}}],
                               "parameters": {"binary_data_output": True}}).encode()
            bodies.append((head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}))
    stop_at = time.monotonic() + SOAK_S
    counts, errors, samples = [0], [], []

    def client(offset: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            i = offset
            while time.monotonic() < stop_at:
                body, headers = bodies[i % len(bodies)]
                response = http.post("/v2/models/cls/infer", content=body, headers=headers)
                if response.status_code != 200:
                    errors.append(response.text)
                counts[0] += 1
                i += 1

    threads = [threading.Thread(target=client, args=(k * 5,)) for k in range(3)]
    for t in threads:
        t.start()
    start = time.monotonic()
    while time.monotonic() < stop_at:
        samples.append((time.monotonic() - start, server.rss_bytes()))
        time.sleep(0.5)
    for t in threads:
        t.join(30)
    assert server.stop() == 0
    assert not errors, errors[:3]
    after_warmup = [rss for t, rss in samples if t >= WARMUP_S]
    growth = max(after_warmup) - after_warmup[0]
    assert counts[0] > 200, f"only {counts[0]} requests in {SOAK_S} s"
    assert growth < ALLOWED_GROWTH, (f"RSS grew {growth / 2**20:.1f} MiB after warm-up over {counts[0]} requests "
                                     f"(samples MiB: {[round(r / 2**20) for r in after_warmup]})")
