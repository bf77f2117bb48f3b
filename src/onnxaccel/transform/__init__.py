"""Model transforms: graph optimization, simplification, opset/shape fixes, FP16 (with automatic mixed
precision), INT8 (static QDQ with calibration, dynamic), provider calibration tables, compile caches.

Entry points (each module does one job; heavy libraries are imported inside the functions that need them):

* :func:`onnxaccel.transform.optimize.optimize` with :class:`~onnxaccel.transform.optimize.OptimizeOptions`:
  the whole `onnxaccel optimize` pipeline; returns an :class:`~onnxaccel.transform.report.OptimizeReport`.
  It takes the output-comparison tools as :class:`~onnxaccel.transform.accuracy.AccuracyTools` (transform
  does not import analysis; ``onnxaccel.cli.optimize.accuracy_tools()`` wires them).
* :func:`onnxaccel.transform.precision.prepare_for_target`: what `run`/`bench` use for --precision.
* :func:`onnxaccel.transform.cached_compile.compile_cached`: a Runner through the compile cache.
* Single steps: ``fp16.convert_fp16``, ``amp.auto_mixed_precision``, ``int8.quantize_static_proto`` /
  ``quantize_dynamic_proto``, ``calibration.load_calibration``, ``calibration_table.write_table``,
  ``graph.ort_optimize`` / ``transformer_fusions``, ``simplify.simplify``, ``shapes.fix_shapes``,
  ``opset.convert_opset``.
"""
