"""Beyond one process: `batch` (offline inference over a dataset, in-process or on Ray Data) and `serve --ray`
(the Open Inference Protocol server as a Ray Serve deployment).

Importing this package loads neither ray nor pyarrow; the modules that need them import them.
"""

from onnxaccel.scale.job import BatchJob, Progress, run_batch
from onnxaccel.scale.report import SCHEMA, BatchReport, WorkerStats
from onnxaccel.scale.writer import BatchOutputs, load_results

__all__ = ["SCHEMA", "BatchJob", "BatchOutputs", "BatchReport", "Progress", "WorkerStats", "load_results",
           "run_batch"]
