"""A CUPTI timeline of one `batch` process (issue 22, seventh session): where the GPU JPEG path's time goes inside
the job. Imported by a batch_vs_bench.py variant before the CLI runs (``trace_*``): torch.profiler records the
process's CUDA activity (every library's kernels, copies and runtime calls: ONNX Runtime's graph launches,
nvImageCodec's and torch's work), the decoding and run threads are labelled by wrapping their entry points, and at
exit a summary of the steady middle of the job is written to $OUT/trace_<tag>.json:

* the GPU's busy share (union of kernels, copies and memsets), per launching role (run / decode / other) and the
  share where the model's and the decoder's work overlap;
* per role, the CUDA runtime calls by total time (a thread waiting in cudaStreamSynchronize, or blocked in a
  cudaFree that waits for the whole device, shows here);
* per decoding batch: wall time against its own GPU work.

Nothing here is imported by the product; it needs torch with CUPTI (the device image's).
"""

from __future__ import annotations

import atexit
import gzip
import json
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

ROLES: dict[int, str] = {}  # native thread id -> role
_lock = threading.Lock()


def _label(role: str):
    """The calling thread's role under each id a trace may give it: the kernel's thread id, pthread_self and its
    low 32 bits (CUPTI's record holds one of these, depending on the version)."""
    tid = threading.get_native_id()
    if tid not in ROLES:
        with _lock:
            for key in (tid, threading.get_ident(), threading.get_ident() & 0xFFFFFFFF):
                ROLES.setdefault(key, role)


def _wrap(owner, name: str, role: str) -> None:
    inner = getattr(owner, name)

    def wrapped(*args, **kwargs):
        _label(role)
        return inner(*args, **kwargs)

    setattr(owner, name, wrapped)


def start(tag: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import onnxaccel.engines.pool as pool
    import onnxaccel.scale.pipeline as pipeline

    _wrap(pipeline._DeviceDecodeSource, "_decode", "decode")
    _wrap(pipeline._DeviceDecodeSource, "finish", "reader")
    for name in ("_run_rows", "_run_direct", "_execute", "_replay"):
        if hasattr(pool.RunnerPool, name):
            _wrap(pool.RunnerPool, name, "run")
    _label("main")
    torch.cuda.init()
    prof = profile(activities=[ProfilerActivity.CUDA])
    prof.start()
    began = time.perf_counter()

    def finish():
        try:
            prof.stop()
            raw = Path(f"/tmp/trace_{tag}.json")
            prof.export_chrome_trace(str(raw))
            summary = summarise(json.loads(raw.read_text()), tag)
            summary["profiled_s"] = time.perf_counter() - began
            out = Path(os.environ.get("OUT", "/tmp"))
            (out / f"trace_{tag}.json").write_text(json.dumps(summary, indent=1))
            print(f"trace {tag}: " + json.dumps(summary.get("headline")), file=sys.stderr, flush=True)
        except Exception as exc:  # a diagnosis must not fail the job's own report
            print(f"trace {tag} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    atexit.register(finish)


def _tid(event: dict) -> int:
    try:
        return int(event.get("tid", -1))
    except (TypeError, ValueError):
        return -1


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Time covered by both span sets (each first merged)."""
    def merge(spans):
        out = []
        for s, e in sorted(spans):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out
    a, b = merge(a), merge(b)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            total += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarise(trace: dict, tag: str) -> dict:
    events = trace.get("traceEvents", [])
    runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in e]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    launches = [e["ts"] for e in runtime if e.get("name") == "cudaGraphLaunch"]
    if not launches:
        return {"tag": tag, "error": "no cudaGraphLaunch in the trace", "events": len(events)}
    # The sessions' warm-up replays come first, then start-up's gap, then the job: the window is the job's launches
    # after the largest gap between two launches, less its first 10 % and last 5 %.
    launches.sort()
    gaps = [b - a for a, b in zip(launches, launches[1:])]
    begin = launches[gaps.index(max(gaps)) + 1] if gaps else launches[0]
    first, last = begin, launches[-1]
    w0, w1 = first + 0.1 * (last - first), last - 0.05 * (last - first)
    span = w1 - w0
    role_of_corr = {}
    api: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    thread_busy: dict[str, float] = defaultdict(float)
    for e in runtime:
        role = ROLES.get(_tid(e), "other")
        corr = (e.get("args") or {}).get("correlation")
        if corr is not None:
            role_of_corr[corr] = role
        s, d = e["ts"], e["dur"]
        if s + d < w0 or s > w1:
            continue
        cut = min(s + d, w1) - max(s, w0)
        api[role][e["name"]][0] += cut
        api[role][e["name"]][1] += 1
        thread_busy[role] += cut
    spans: dict[str, list] = defaultdict(list)
    streams: dict[str, dict] = defaultdict(lambda: {"busy_us": 0.0, "count": 0, "roles": defaultdict(int)})
    names: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in gpu:
        s, d = e["ts"], e["dur"]
        if s + d < w0 or s > w1:
            continue
        a, b = max(s, w0), min(s + d, w1)
        args = e.get("args") or {}
        role = role_of_corr.get(args.get("correlation"), "other")
        spans[role].append((a, b))
        spans["all"].append((a, b))
        st = streams[str(args.get("stream"))]
        st["busy_us"] += b - a
        st["count"] += 1
        st["roles"][role] += 1
        names[role][e.get("name", "?")[:60]] += b - a
    share = {k: _union(v) / span for k, v in spans.items()}
    overlap = _intersect(spans.get("run", []), spans.get("decode", [])) / span if spans.get("run") else 0.0
    native = {threading_id: role for threading_id, role in ROLES.items() if threading_id < 1 << 22}  # gettid's
    threads = {role: sum(1 for r in native.values() if r == role) for role in set(native.values())}
    result = {
        "tag": tag,
        "window_s": span / 1e6,
        "threads": threads,
        "trace_tids_by_role": {role: sorted({_tid(e) for e in runtime
                                             if ROLES.get(_tid(e), "other") == role})[:8]
                               for role in ("run", "decode", "reader", "main", "other")},
        "gpu_busy_share": share,
        "run_decode_overlap_share": overlap,
        "api_per_role": {role: {n: {"s": round(v[0] / 1e6, 4), "count": v[1],
                                    "share_of_window_per_thread": round(v[0] / span / max(1, threads.get(role, 1)), 4)}
                                for n, v in sorted(calls.items(), key=lambda kv: -kv[1][0])[:12]}
                         for role, calls in api.items()},
        "streams": {k: {**v, "roles": dict(v["roles"]), "busy_share": v["busy_us"] / span}
                    for k, v in sorted(streams.items(), key=lambda kv: -kv[1]["busy_us"])[:10]},
        "gpu_work_per_role": {role: {n: round(t / span, 4) for n, t in sorted(v.items(), key=lambda kv: -kv[1])[:10]}
                              for role, v in names.items()},
        "graph_launches_in_window": sum(1 for t in launches if w0 <= t <= w1),
    }
    result["headline"] = {"window_s": round(span / 1e6, 3), "gpu_busy": round(share.get("all", 0), 3),
                          "run": round(share.get("run", 0), 3), "other": round(share.get("other", 0), 3),
                          "decode": round(share.get("decode", 0), 3), "overlap": round(overlap, 3),
                          "decode_api_top": list(result["api_per_role"].get("decode", {}).items())[:3]}
    # A 100 ms slice of the middle for a person to open (chrome://tracing, Perfetto).
    mid = (w0 + w1) / 2
    keep = [e for e in events if "ts" in e and mid <= e["ts"] <= mid + 1e5]
    out = Path(os.environ.get("OUT", "/tmp"))
    with gzip.open(out / f"trace_{tag}_slice.json.gz", "wt") as fh:
        json.dump({"traceEvents": keep, "roles": {str(k): v for k, v in ROLES.items()}}, fh)
    return result
