"""The load generator and its clients: throughput and latency of an Open Inference Protocol server (onnxaccel
``serve``, Triton, KServe) per concurrency level, like perf_analyzer.

A feature beside ``bench`` and ``serve`` (docs/ARCHITECTURE.md, "Layers"): it uses ``bench``'s latency
statistics and speaks the wire format ``serve.protocol`` defines; nothing in ``serve`` imports it. The clients
need only the core install for HTTP; gRPC needs the ``serve`` extra (grpcio).

    from onnxaccel.loadtest import LoadtestConfig, run_loadtest
    report = run_loadtest(LoadtestConfig(url="http://127.0.0.1:8000", model="resnet50", binary=True))
"""

from onnxaccel.loadtest.generator import make_inputs, run_loadtest
from onnxaccel.loadtest.results import SCHEMA, LevelResult, LoadtestConfig, LoadtestReport

__all__ = ["SCHEMA", "LevelResult", "LoadtestConfig", "LoadtestReport", "make_inputs", "run_loadtest"]
