"""Model transforms: graph optimization, simplification, opset/shape fixes, FP16 (with automatic mixed
precision), INT8 (static QDQ with calibration, dynamic), provider calibration tables, compile caches.

Entry points (each module does one job; heavy libraries are imported inside the functions that need them):

* :func:`onnxaccel.transform.optimize.optimize` with :class:`~onnxaccel.transform.optimize.OptimizeOptions`:
  the whole `onnxaccel optimize` pipeline; returns an :class:`~onnxaccel.transform.report.OptimizeReport`.
  It judges accuracy with :mod:`onnxaccel.compare`; AMP's divergence search is passed in as
  ``find_divergence`` (transform does not import analysis; ``onnxaccel.cli.optimize`` wires it).
* :func:`onnxaccel.transform.cached_compile.compile_cached`: a Runner through the compile cache.
* Single steps: ``amp.auto_mixed_precision``, ``int8.quantize_static_proto`` / ``quantize_dynamic_proto``,
  ``calibration.load_calibration``, ``calibration_table.write_table``, ``graph.ort_optimize`` /
  ``transformer_fusions``, ``simplify.simplify``, ``shapes.fix_shapes``, ``opset.convert_opset``.

FP16 conversion, dynamic INT8 and the checked model writer live below the pipeline, in :mod:`onnxaccel.precision`
(what `run`/`bench --precision` use); transform builds on them.
"""
