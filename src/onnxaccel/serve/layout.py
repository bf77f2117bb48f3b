"""The default process layout of `serve` on a GPU target: how many decoding workers, one shared model process,
how many instances, graph capture. Flags override it; CPU targets keep one process and one instance.

Why: with one process the event loop decoding requests, not the GPU, limits a GPU server. Measured on an H200
host with 16 cores (issue 22, ResNet-50 FP16, 1-image binary requests at concurrency 64, graph capture): the
single process served 1,205 infer/s; with one model process and 4 instances, 5 decoding workers 5,493 and 8
workers 6,296 in the same run (their event loops ~0.9 ms of CPU per request: 5 of them were ~95% busy); 8
workers with 3 instances 5,981 and with 2 5,218 (a later run, same machine). The rule: a decoding worker per 2
cores (the rest go to the model process's run threads, the decoding threads of encoded images and the kernel's
network stack), at most 8; 4 instances (2 below 8 cores) so copies and runs of different batches overlap. Graph capture is asked on
targets whose provider captures (target.py GRAPH_OPTION); the server drops it for a model that cannot replay a
fixed shape (serve/instance.py graph_capture_possible) and says so. Since bodies are received straight into the
workers' arenas (security.py BodyIntake) a worker spends ~0.6 ms per such request, and on the H200 no layout of
1-6 instances or queue delay of 0.5-4 ms came within 20 points of in-process at concurrency 64: the round trip
bounds it there (docs/BENCHMARKS.md, "Issue 22, fifth session"). Only the CUDA layout was measured; the
ROCm/MIGraphX layout follows the same rule (without graph capture) and was never executed on AMD hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxaccel.target import GRAPH_OPTION, Target

#: Cores per decoding worker, and the most workers (measured: 8 workers on 16 cores, see the docstring).
CORES_PER_WORKER = 2
MAX_WORKERS = 8
#: Providers whose graph capture the server uses by default: CUDA only, where it was measured (ROCm's HIP graphs
#: were never executed here on AMD hardware; tensorrt's capture wraps an engine per shape): others ask for it in
#: the target.
AUTO_GRAPH = ("cuda",)


@dataclass(frozen=True)
class ServeLayout:
    """Processes and instances for a server, and whether it was chosen automatically."""

    workers: int = 1
    shared_models: bool = False
    instances: int | None = None
    #: The target with graph capture turned on (or as given).
    target: str = ""
    automatic: bool = False

    def describe(self) -> str:
        """One line: what was chosen and how to override it."""
        parts = [f"--workers {self.workers}"] + (["--shared-models"] if self.shared_models else []) + \
                [f"--instances {self.instances}"]
        return (f"GPU target: serving with {' '.join(parts)}, target {self.target} (chosen from "
                "the machine's cores; graph capture where the model allows). Override with --workers, "
                "--shared-models or --instances.")


def choose_layout(cores: int, target: Target) -> ServeLayout:
    """The default layout for ``target`` on a machine with ``cores`` CPU cores (module docstring): automatic on
    GPU targets, today's single process on CPU targets."""
    if not target.is_gpu:
        return ServeLayout(target=str(target))
    workers = max(1, min(MAX_WORKERS, cores // CORES_PER_WORKER))
    instances = 4 if cores >= 8 else 2
    graph = GRAPH_OPTION.get(target.device) if target.device in AUTO_GRAPH and target.engine == "ort" else None
    chosen = target
    if graph and graph not in target.option_dict:
        chosen = target.with_options({graph: "1"})
    return ServeLayout(workers=workers, shared_models=workers > 1, instances=instances, target=str(chosen),
                       automatic=True)


def layout_flags_given(workers: int | None, shared_models: bool | None, instances: int | None) -> bool:
    """Whether the user set any layout flag (then no layout is chosen for them)."""
    return workers is not None or shared_models is not None or instances is not None
