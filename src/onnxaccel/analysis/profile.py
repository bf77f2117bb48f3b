"""ONNX Runtime's profiler, turned into per-op-type and per-node tables, hotspots and a Chrome trace.

The profile is a Chrome-trace JSON list (as ONNX Runtime 1.31.1 writes it with
``SessionOptions.enable_profiling``). Each node run is one event with
``cat == "Node"`` and ``name == "<node>_kernel_time"``; its ``args`` carry ``op_name`` and ``provider``.
Each run ends with a ``cat == "Session"``, ``name == "model_run"`` event spanning it. A build with the
CUDA (CUPTI) or ROCm (roctracer) profiler adds ``cat == "Kernel"`` events, one per GPU kernel, with the
node's ``op_name`` in ``args`` (microsoft/onnxruntime#8406, #10911). Providers that compile subgraphs show
one node per partition, named ``...MGXKernel_...`` (MIGraphX) or ``...TRTKernel_...`` (TensorRT).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from onnxaccel.engines.base import CPU, Runner
from onnxaccel.engines.ort import OrtBoundRun, capture_native_stderr, import_ort
from onnxaccel.engines.ort_ep_options import ep_environment
from onnxaccel.errors import InferenceError, InputError
from onnxaccel.pipeline import explain_failure, prepare

SCHEMA = "onnxaccel.profile/1"

FUSED_MARKERS = {"MGXKernel_": "MIGraphX", "TRTKernel_": "TensorRT"}

PERTURBATION_NOTE = ("Profiling perturbs timing: ONNX Runtime timestamps every node and tracks memory, so runs "
                     "are slower than without it (up to 3x reported in microsoft/onnxruntime#20238). Use the "
                     "table for where time goes; use `onnxaccel bench` for latency.")
HOST_TIME_NOTE = ("Node times on {provider} are measured on the host: GPU kernels run asynchronously, so a "
                  "node's time is mostly its launch cost and the run total is the real figure. For device time "
                  "per kernel use --kernels (nsys or rocprofv3).")


@dataclass(frozen=True)
class NodeTime:
    """Time of one node across the profiled runs, from ONNX Runtime's profiler."""
    name: str
    op_type: str
    provider: str
    calls: int
    total_us: float
    percent: float
    #: "MIGraphX"/"TensorRT" for a fused subgraph that runs as one node.
    fused: str | None = None

    @property
    def mean_us(self) -> float:
        """Mean time per call in microseconds (0 when never called)."""
        return self.total_us / self.calls if self.calls else 0.0

    def to_dict(self) -> dict:
        """JSON-ready form of the node's timing."""
        return {"name": self.name, "op_type": self.op_type, "provider": self.provider, "calls": self.calls,
                "total_us": self.total_us, "mean_us": self.mean_us, "percent": self.percent, "fused": self.fused}


@dataclass(frozen=True)
class OpTime:
    """Time of every node of one op type on one provider, summed."""
    op_type: str
    provider: str
    nodes: int
    calls: int
    total_us: float
    percent: float

    @property
    def mean_us(self) -> float:
        """Mean time per call in microseconds (0 when never called)."""
        return self.total_us / self.calls if self.calls else 0.0

    def to_dict(self) -> dict:
        """JSON-ready form of the op type's timing."""
        return {"op_type": self.op_type, "provider": self.provider, "nodes": self.nodes, "calls": self.calls,
                "total_us": self.total_us, "mean_us": self.mean_us, "percent": self.percent}


@dataclass(frozen=True)
class KernelTime:
    """A GPU kernel from the runtime's own device profiler, or from rocprofv3/rocprof/nsys."""

    name: str
    calls: int
    total_us: float
    percent: float
    op_type: str | None = None

    @property
    def mean_us(self) -> float:
        """Mean time per launch in microseconds (0 when never launched)."""
        return self.total_us / self.calls if self.calls else 0.0

    def to_dict(self) -> dict:
        """JSON-ready form of the kernel's timing."""
        return {"name": self.name, "op_type": self.op_type, "calls": self.calls, "total_us": self.total_us,
                "mean_us": self.mean_us, "percent": self.percent}


@dataclass(frozen=True)
class ParsedProfile:
    """An ONNX Runtime profile file reduced to run times and per-node, per-op and per-kernel totals."""
    runs_us: tuple[float, ...]
    nodes: tuple[NodeTime, ...]
    ops: tuple[OpTime, ...]
    kernels: tuple[KernelTime, ...]

    @property
    def node_total_us(self) -> float:
        """Sum of every node's time over all runs, in microseconds."""
        return sum(n.total_us for n in self.nodes)


@dataclass
class ProfileResult:
    """What ``onnxaccel profile`` measured: the parsed profile plus the model, target and run settings."""
    model: str
    target: str
    providers: list[str]
    input_shapes: dict[str, list[int]]
    runs: int
    warmup: int
    profile: ParsedProfile
    trace: str | None = None
    notes: list[str] = field(default_factory=list)
    #: Kernel statistics from an external profiler (rocprofv3, rocprof, nsys), when asked for.
    external: dict | None = None

    @property
    def node_count(self) -> int:
        """Number of nodes that appear in the profile."""
        return len(self.profile.nodes)

    def hotspots(self, k: int = 10) -> tuple[NodeTime, ...]:
        """The ``k`` slowest nodes (the profile keeps nodes sorted by total time)."""
        return self.profile.nodes[:k]

    def to_dict(self) -> dict:
        """JSON-ready report (schema ``SCHEMA``) for ``profile --json``."""
        runs = np.asarray(self.profile.runs_us or [0.0]) / 1e3
        return {
            "schema": SCHEMA, "model": self.model, "target": self.target, "providers": self.providers,
            "input_shapes": self.input_shapes, "runs": self.runs, "warmup": self.warmup,
            "run_ms": {"mean": float(runs.mean()), "min": float(runs.min()), "max": float(runs.max())},
            "node_total_ms_per_run": self.profile.node_total_us / max(1, self.runs) / 1e3,
            "node_count": self.node_count,
            "ops": [o.to_dict() for o in self.profile.ops],
            "nodes": [n.to_dict() for n in self.profile.nodes],
            "kernels": [k.to_dict() for k in self.profile.kernels],
            "trace": self.trace, "notes": self.notes, "external": self.external,
        }


def profile_runner(
    runner: Runner,
    feeds: Mapping[str, np.ndarray],
    *,
    runs: int = 20,
    warmup: int = 3,
    trace: str | os.PathLike | None = None,
) -> tuple[ParsedProfile, list[dict], list[str]]:
    """Profile ``runs`` runs after ``warmup`` in a separate session built like the runner's own.

    Returns the parsed tables, the raw trace events (warm-up included, for the Chrome trace) and notes.
    """
    if runs < 1 or warmup < 0:
        raise InputError(f"--runs must be >= 1 and --warmup >= 0 (got {runs}, {warmup}).", "e.g. --runs 20")
    session_options = getattr(runner, "_session_options", None)
    providers = getattr(runner, "_providers", None)
    if session_options is None or providers is None:
        raise InferenceError(f"Profiling needs an ONNX Runtime target; {runner.target} is not one.",
                             "Use an ort target (cpu, cuda, migraphx, ...).")

    ort = import_ort()

    with tempfile.TemporaryDirectory(prefix="onnxaccel-profile-") as tmp:
        so = session_options()
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        with capture_native_stderr():
            # The run's ORT_MIGRAPHX_* settings too (Microsoft 1.20-1.22.1 builds read FP16/INT8 only there).
            with ep_environment(getattr(runner, "provider_env", {})):
                session = ort.InferenceSession(str(runner.model.path), so, providers=providers())
        # IO binding, as `bench` measures: inputs stay on the device, so runs show the model, not host copies.
        bound = OrtBoundRun(SimpleNamespace(ort=ort, session=session, target=runner.target, model=runner.model), feeds)
        try:
            for _ in range(warmup + runs):
                bound.run()
        finally:
            path = session.end_profiling()
        events = json.loads(Path(path).read_text())
    parsed = parse_profile(events, skip_runs=warmup)
    notes = [PERTURBATION_NOTE]
    provider = runner.target.provider if runner.target.engine == "ort" else CPU
    if provider != CPU and not parsed.kernels:
        notes.append(HOST_TIME_NOTE.format(provider=provider.replace("ExecutionProvider", "")))
    if trace is not None:
        write_chrome_trace(events, trace, {"model": runner.model.source, "target": str(runner.target),
                                           "warmup_runs": warmup, "profiled_runs": runs})
    return parsed, events, notes


def parse_profile(events: list[dict], *, skip_runs: int = 0) -> ParsedProfile:
    """Tables from ONNX Runtime profile events, leaving out the first ``skip_runs`` runs (warm-up)."""
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    kept = runs[skip_runs:]
    # A run's node events fall inside its model_run span (the span's event is written after them).
    start = 0.0 if skip_runs <= 0 else (kept[0]["ts"] if kept else float("inf"))

    def in_kept_runs(e: dict) -> bool:
        return e.get("ts", 0) >= start

    per_node: dict[str, dict] = {}
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time") or not in_kept_runs(e):
            continue
        name = e["name"][: -len("_kernel_time")]
        args = e.get("args", {})
        entry = per_node.setdefault(name, {"op": args.get("op_name", "?"), "provider": args.get("provider", "?"),
                                           "calls": 0, "total": 0.0})
        entry["calls"] += 1
        entry["total"] += float(e.get("dur", 0))
    total = sum(v["total"] for v in per_node.values()) or 1.0
    nodes = sorted((NodeTime(name, v["op"], v["provider"], v["calls"], v["total"], 100 * v["total"] / total,
                             _fused(name, v["op"])) for name, v in per_node.items()),
                   key=lambda n: n.total_us, reverse=True)
    ops: dict[tuple[str, str], list] = {}
    for n in nodes:
        key = (f"{n.fused} fused subgraph" if n.fused else n.op_type, n.provider)
        entry = ops.setdefault(key, [0, 0, 0.0])
        entry[0] += 1
        entry[1] += n.calls
        entry[2] += n.total_us
    op_rows = sorted((OpTime(op, ep, v[0], v[1], v[2], 100 * v[2] / total) for (op, ep), v in ops.items()),
                     key=lambda o: o.total_us, reverse=True)
    return ParsedProfile(tuple(float(r.get("dur", 0)) for r in kept), tuple(nodes), tuple(op_rows),
                         _device_kernels(events, in_kept_runs))


def write_chrome_trace(events: list[dict], path: str | os.PathLike, metadata: dict) -> Path:
    """Write the events in the Chrome trace "JSON Object Format" (traceEvents + metadata), which
    chrome://tracing and Perfetto both open."""
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"producer": "onnxaccel profile", "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                         **{k: str(v) for k, v in metadata.items()}}}
    out.write_text(json.dumps(doc))
    return out


def _fused(name: str, op_type: str) -> str | None:
    for marker, engine in FUSED_MARKERS.items():
        if marker in name or marker in op_type:
            return engine
    return None


def _device_kernels(events: list[dict], keep) -> tuple[KernelTime, ...]:
    per: dict[str, list] = {}
    for e in events:
        if e.get("cat") != "Kernel" or not keep(e):
            continue
        entry = per.setdefault(e.get("name", "?"), [0, 0.0, e.get("args", {}).get("op_name")])
        entry[0] += 1
        entry[1] += float(e.get("dur", 0))
    total = sum(v[1] for v in per.values()) or 1.0
    return tuple(sorted((KernelTime(k, v[0], v[1], 100 * v[1] / total, v[2]) for k, v in per.items()),
                        key=lambda k: k.total_us, reverse=True))


def profile_model(
    source,
    target,
    *,
    runs: int = 20,
    warmup: int = 3,
    trace: str | os.PathLike | None = None,
    inputs=(),
    shapes=None,
    batch: int | None = None,
    strict: bool = False,
    value_ranges=None,
) -> ProfileResult:
    """Prepare the model for the target (as ``run`` does) and profile it."""
    prepared = prepare(source, target, inputs=inputs, shapes=shapes, batch=batch, strict=strict,
                       value_ranges=value_ranges)
    try:
        try:
            parsed, _, notes = profile_runner(prepared.runner, prepared.feeds, runs=runs, warmup=warmup, trace=trace)
        except InferenceError as exc:  # name the synthesized inputs, as run and compare do
            raise explain_failure(exc, prepared.origins) from exc
        providers = list(prepared.runner.providers)
    finally:
        prepared.close()
    return ProfileResult(
        model=prepared.model.source, target=str(target), providers=providers,
        input_shapes={k: list(v) for k, v in prepared.model.input_shapes.items()}, runs=runs, warmup=warmup,
        profile=parsed, trace=str(Path(trace).expanduser()) if trace else None,
        notes=list(prepared.warnings) + notes,
    )
