"""Precision conversion the pipeline needs: a model at a target's precision when its provider cannot convert.

One layer with ``engines``, below ``pipeline`` (docs/ARCHITECTURE.md, "Layers"): it imports engines and
the core, nothing above; ``transform`` (`optimize`) builds on it.

* :func:`~onnxaccel.precision.variant.convert_for_target` -> :class:`~onnxaccel.precision.variant.PrecisionVariant`
  (the model to run, the target as asked); ``prepare_for_target`` gives the (model, engine target) pair.
* :mod:`~onnxaccel.precision.fp16`: FP16 with FP32 inputs/outputs, what stays FP32 and why
  (:mod:`~onnxaccel.precision.fp16_rules`, :mod:`~onnxaccel.precision.fp16_sequences`).
* :mod:`~onnxaccel.precision.int8`: dynamic INT8 (what `-p int8` runs on the CPU), the INT8 settings.
* :mod:`~onnxaccel.precision.checkpoint`: every model onnxaccel writes is sorted, fully checked, written atomically.
"""

from onnxaccel.precision.variant import PrecisionVariant, convert_for_target, prepare_for_target

__all__ = ["PrecisionVariant", "convert_for_target", "prepare_for_target"]
