"""Output comparison, tolerances and accuracy metrics: one set of rules beneath every feature that judges outputs.

Layer (docs/ARCHITECTURE.md, "Layers"): beside ``pipeline``, below the features. ``analysis`` (the
``compare`` command, ``bisect``), ``transform`` (``optimize``'s accuracy gate), ``bench``/``tune`` (the accuracy
of a cell) and ``conformance`` (``check``) import from here; nothing here runs a model (running lives in the
pipeline and engines; comparing here, as Polygraphy keeps its ``comparator`` apart from its runners).

* :mod:`~onnxaccel.compare.elementwise`: the element-wise rule ``|b - a| <= atol + rtol * |a|`` with NaN/Inf
  matching, applied by both comparators below.
* :mod:`~onnxaccel.compare.outputs`: :func:`compare_outputs` / :func:`compare_array`, error metrics, top-k
  agreement, :data:`DEFAULT_TOLERANCES` per precision.
* :mod:`~onnxaccel.compare.verdict`: :class:`GateSpec` and :func:`evaluate`, what "accurate enough" means.
* :mod:`~onnxaccel.compare.tolerance`: ONNX test-case tolerances per element type (:class:`TolerancePolicy`,
  :func:`compare_value`), sequences, maps and optionals.
"""

from onnxaccel.compare.elementwise import Elementwise, as_float64, elementwise
from onnxaccel.compare.outputs import (
    DEFAULT_TOLERANCES, CompareResult, OutputComparison, TopKAgreement, check_tolerances, compare_array,
    compare_outputs, default_tolerances,
)
from onnxaccel.compare.tolerance import OutputCheck, Tolerance, TolerancePolicy, check_array, compare_value
from onnxaccel.compare.verdict import GateCheck, GateResult, GateSpec, evaluate

__all__ = [
    "DEFAULT_TOLERANCES", "CompareResult", "Elementwise", "GateCheck", "GateResult", "GateSpec", "OutputCheck",
    "OutputComparison", "Tolerance", "TolerancePolicy", "TopKAgreement", "as_float64", "check_array",
    "check_tolerances", "compare_array", "compare_outputs", "compare_value", "default_tolerances", "elementwise",
    "evaluate",
]
