"""Stand-in for what `import migraphx` finds when AMD's module is absent but something else is named migraphx
(a stray folder on sys.path, or a package left by the PyPI placeholder `migraphx` 0.0.1, which ships no code:
rocm_facts.md §1.2). It has no parse_onnx."""
