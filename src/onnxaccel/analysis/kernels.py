"""Run the same workload under a GPU profiler (rocprofv3, rocprof or nsys) and summarize kernel statistics
the way ``rocprof --stats`` does: one row per kernel with calls, total and mean time and share.

Command lines and output files (each tool's documentation):

* rocprofv3 (ROCm >= 6.2): ``rocprofv3 --kernel-trace --stats -d DIR -o NAME --output-format csv -- CMD``
  writes ``NAME_kernel_stats.csv`` (under DIR, possibly in a host/pid subfolder) with the columns
  "Name","Calls","TotalDurationNs","AverageNs","Percentage","MinNs","MaxNs","StdDev". The long
  ``--output-format`` is the spelling every release accepts: the short ``-f`` exists only from ROCm 7.0
  (see ``profiler_command``).
* rocprof (v1/v2, older ROCm): ``rocprof --stats -o DIR/results.csv CMD`` writes ``results.stats.csv`` with
  "Name","Calls","TotalDurationNs","AverageNs","Percentage".
* nsys: ``nsys profile --trace=cuda -o DIR/report CMD``, then ``nsys stats --report cuda_gpu_kern_sum
  --format csv --output DIR/stats DIR/report.nsys-rep`` writes ``stats_cuda_gpu_kern_sum.csv`` with
  "Time (%)","Total Time (ns)","Instances","Avg (ns)",...,"Name" (older releases: "Time(%)", "Average").

The workload is this module run as a script: it prepares the model exactly as ``onnxaccel run`` does and
runs it warmup + runs times with IO binding. Totals include the warm-up runs and whatever kernels session
creation launches; the per-run figure divides by every run.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from onnxaccel.analysis.profile import KernelTime
from onnxaccel.errors import InferenceError, UsageError
from onnxaccel.pipeline import prepare
from onnxaccel.target import Target, parse_target

TOOLS = ("rocprofv3", "rocprof", "nsys")
_INSTALL_HINT = ("Install ROCm's rocprofiler-sdk (rocprofv3) for AMD GPUs or Nsight Systems (nsys) for NVIDIA, "
                 "put it on PATH, or drop --kernels.")
_FOR_DEVICE = {"migraphx": ("rocprofv3", "rocprof"), "rocm": ("rocprofv3", "rocprof"),
               "cuda": ("nsys",), "tensorrt": ("nsys",)}


@dataclass(frozen=True)
class KernelReport:
    """GPU kernel times collected by an external profiler (nsys, rocprofv3, rocprof) over a profiled run."""
    tool: str
    command: list[str]
    kernels: tuple[KernelTime, ...]
    total_runs: int

    @property
    def total_us(self) -> float:
        """Summed time of every kernel over all runs, in microseconds."""
        return sum(k.total_us for k in self.kernels)

    def to_dict(self) -> dict:
        """JSON-ready report with per-run kernel time and launches, for ``profile --kernels``."""
        return {"tool": self.tool, "command": self.command, "total_runs": self.total_runs,
                "kernel_ms_per_run": self.total_us / max(1, self.total_runs) / 1e3,
                "kernel_launches_per_run": sum(k.calls for k in self.kernels) / max(1, self.total_runs),
                "kernels": [k.to_dict() for k in self.kernels]}


def available_tools() -> dict[str, str]:
    """Kernel profilers found on PATH, by name, with their paths."""
    return {name: path for name in TOOLS if (path := shutil.which(name))}


def choose_tool(requested: str, target: Target) -> str:
    """``auto`` picks the profiler for the target's GPU that is on PATH; a name must be on PATH."""
    found = available_tools()
    if requested != "auto":
        if requested not in TOOLS:
            raise UsageError(f"Unknown kernel profiler '{requested}'.", f"Use auto or one of: {', '.join(TOOLS)}.")
        if requested not in found:
            raise UsageError(f"--kernels {requested}: '{requested}' is not on PATH.", _INSTALL_HINT)
        return requested
    wanted = _FOR_DEVICE.get(target.device, ())
    for name in wanted:
        if name in found:
            return name
    if not wanted:
        raise UsageError(f"Kernel profiling needs a GPU target; {target} runs on the CPU.",
                         "Drop --kernels, or use --target cuda / migraphx.")
    raise UsageError(f"--kernels: none of {', '.join(wanted)} is on PATH.", _INSTALL_HINT)


def run_kernel_profile(tool: str, source: str, target: Target, *, runs: int, warmup: int,
                       inputs=(), shapes=None, batch: int | None = None, timeout: float = 600) -> KernelReport:
    """Run the model under ``tool`` in a child process and parse the profiler's kernel summary.

    The workload runs in a separate interpreter (this module's ``__main__``) because the profiler must launch it."""
    spec = json.dumps({"source": source, "target": str(target), "runs": runs, "warmup": warmup,
                       "inputs": list(inputs), "shapes": {k: list(v) for k, v in (shapes or {}).items()},
                       "batch": batch})
    workload = [sys.executable, "-m", "onnxaccel.analysis.kernels", spec]
    with tempfile.TemporaryDirectory(prefix="onnxaccel-kernels-") as tmp:
        out = Path(tmp)
        command = profiler_command(tool, out, workload)
        _call(command, timeout)
        if tool == "nsys":
            _call(["nsys", "stats", "--report", "cuda_gpu_kern_sum", "--format", "csv", "--force-export=true",
                   "--output", str(out / "stats"), str(out / "report.nsys-rep")], timeout)
        pattern = {"rocprofv3": "*kernel_stats.csv", "rocprof": "results.stats.csv",
                   "nsys": "*cuda_gpu_kern_sum*.csv"}[tool]
        files = sorted(out.rglob(pattern))
        if not files:
            raise InferenceError(f"{tool} ran but wrote no kernel statistics ({pattern} under {out}).",
                                 "Run the command by hand to see why: " + " ".join(command))
        kernels = parse_kernel_stats(files[0].read_text(errors="replace"))
    return KernelReport(tool, command, kernels, runs + warmup)


# rocprofv3's options are used as its argument parser declares them in every release since 6.2. The parser is
# source/bin/rocprofv3.py of ROCm/rocprofiler-sdk, later projects/rocprofiler-sdk/source/bin/rocprofv3.py of
# ROCm/rocm-systems:
#   rocm-6.2.0 (ROCm/rocprofiler-sdk@b2b99d424a6911c85d57ff9f52ca1d7b1548cfd4): ``--output-format`` only,
#     store_true ``--kernel-trace`` / ``--stats``, default format ["csv"];
#   0.5.0, ROCm 6.3 (ROCm/rocprofiler-sdk@8ab1ed78d8c2afb25fedddb7684aff08d1233c5c, amd-mainline):
#     ``--output-format`` only, no default (csv when left out);
#   1.0.0, ROCm 7.0 (ROCm/rocm-systems@1b1610fc2b2ab32af71e6e04e4d4a6a4ae597992, develop): ``-f`` /
#     ``--output-format``, default rocpd (SQLite) -- so csv must be asked for. ``-f`` arrived with
#     ROCm/rocm-systems@0e93099fd762569f98db91bfc26f9ba7f7043952 (May 2025, rocpd output).
# Every release splits its own options from the application at the first ``--``. The excerpts are vendored in
# tests/analysis/upstream/rocprofv3_*.txt and our command line is parsed with them there.


def profiler_command(tool: str, out: Path, workload: list[str]) -> list[str]:
    """The profiler's command line that runs ``workload`` and writes its statistics under ``out``."""
    if tool == "rocprofv3":
        return ["rocprofv3", "--kernel-trace", "--stats", "-d", str(out), "-o", "onnxaccel", "--output-format", "csv",
                "--", *workload]
    if tool == "rocprof":
        return ["rocprof", "--stats", "-o", str(out / "results.csv"), *workload]
    return ["nsys", "profile", "--trace=cuda", "--force-overwrite=true", "-o", str(out / "report"), *workload]


def parse_kernel_stats(text: str) -> tuple[KernelTime, ...]:
    """Rows of a rocprof/rocprofv3 ``*stats.csv`` or an nsys ``cuda_gpu_kern_sum`` CSV, by header names."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "Name" in line and ("Calls" in line or "Instances" in line)),
                 None)
    if start is None:
        return ()
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    if not rows:
        return ()
    columns = rows[0].keys()
    name_col = "Name"
    calls_col = _column(columns, ("Calls", "Instances"))
    total_col = _column(columns, ("TotalDurationNs", "Total Time (ns)", "Total Time"))
    kernels = []
    for row in rows:
        try:
            calls = int(float(row[calls_col]))
            total_ns = float(str(row[total_col]).replace(",", ""))
        except (KeyError, TypeError, ValueError):
            continue
        kernels.append((row.get(name_col, "?"), calls, total_ns / 1e3))
    total = sum(k[2] for k in kernels) or 1.0
    return tuple(sorted((KernelTime(n, c, t, 100 * t / total) for n, c, t in kernels),
                        key=lambda k: k.total_us, reverse=True))


def _column(columns, candidates: tuple[str, ...]) -> str:
    for want in candidates:
        for col in columns:
            if col.strip() == want or col.strip().startswith(want):
                return col
    return candidates[0]


def _call(command: list[str], timeout: float) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise InferenceError(f"{command[0]} did not finish within {timeout:.0f} s.", "Use fewer --runs.") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise InferenceError(f"{command[0]} failed (exit {done.returncode}): {' / '.join(tail)}",
                             "Run the command by hand to see the whole output: " + " ".join(command),
                             details=done.stderr)


def _workload(spec_text: str) -> None:
    """The profiled process: prepare like `onnxaccel run`, then run with IO binding. Prints nothing."""
    spec = json.loads(spec_text)
    prepared = prepare(spec["source"], parse_target(spec["target"]), inputs=spec["inputs"],
                       shapes={k: tuple(v) for k, v in spec["shapes"].items()}, batch=spec["batch"])
    bound = prepared.runner.bind(prepared.feeds)
    for _ in range(spec["warmup"] + spec["runs"]):
        bound.run()
    bound.outputs()
    prepared.close()


if __name__ == "__main__":
    _workload(sys.argv[1])
