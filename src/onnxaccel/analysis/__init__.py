"""See inside a model and its runs. One module per job; import the one you need:

* ``graph_stats``: ops, parameters, FLOPs/MACs per node, activation memory (``graph_stats``, ``model_flops``)
* ``flop_coverage``: what share of the arithmetic (and of the MAC ops) a FLOP count covers, and why
* ``placement``: nodes per provider, fallbacks, partitions, Memcpy nodes, graph-capture verdict
* ``inspect``: the two above as one result (``inspect_model``), what ``onnxaccel inspect`` shows
* ``profile``: ONNX Runtime's profiler as per-op and per-node tables and a Chrome trace
* ``kernels``: the same workload under rocprofv3/rocprof/nsys, as kernel statistics
* ``compare``: two sets of outputs against tolerances (``compare_outputs``, ``compare_targets``)
* ``bisect``: the first node where two targets or precisions diverge (``find_divergence``)
"""
