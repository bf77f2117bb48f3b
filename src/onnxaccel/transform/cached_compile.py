"""Compile a model for a target through the compile cache, timing session creation plus the first run.

The first run is part of the time because compiling providers may compile there: the MIGraphX EP compiles
at session creation only when every input shape is static, otherwise on the first inference
(migraphx_execution_provider.cc, the ``no_input_shape`` path), and it compiles again for each new shape.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping

import numpy as np
import onnx

from onnxaccel import providers
from onnxaccel.engines import Runner, compile_model
from onnxaccel.engines.ort import ort_version, runtime_limits
from onnxaccel.errors import InferenceError
from onnxaccel.model import Model
from onnxaccel.precision import prepare_for_target
from onnxaccel.precision.checkpoint import CheckerError, save_model
from onnxaccel.target import Target
from onnxaccel.engines.cache_key import CompileKey
from onnxaccel.transform.compile_cache import CacheUse, cache_key, cache_kind, record_compile
from onnxaccel.transform.graph import ort_optimize

OPTIMIZED_FILE = "model.onnx"
#: In an entry whose optimized graph could not be saved or reloaded: why (see _uncacheable).
UNCACHEABLE_FILE = "uncacheable.txt"


def compile_cached(
    model: Model,
    target: Target,
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    strict: bool = False,
    key: CompileKey | None = None,
) -> tuple[Runner, CacheUse]:
    """Build a Runner for ``model`` (bound) on ``target`` using (and filling) its compile cache.

    ``key`` defaults to :func:`cache_key` for what is installed here. With ``feeds`` the first run is
    included in the time. Targets without a cache (native MIGraphX engine, ROCm EP) compile directly.
    """
    if not model.is_bound:
        model = model.bind()
    kind = cache_kind(target)
    if kind is None:
        start = time.perf_counter()
        runner = compile_model(*prepare_for_target(model, target), strict=strict)
        _first_run(runner, feeds)
        runner.target = target
        return runner, CacheUse(None, False, time.perf_counter() - start,
                                [f"{target} has no compile cache in onnxaccel yet; compiled directly."])
    key = key or cache_key(model, target)
    runnable, engine_target = prepare_for_target(model, target)
    start = time.perf_counter()
    uncached = None
    if kind == "ort-optimized":
        runner, hit, notes, uncached = _ort_optimized(key, runnable, engine_target, strict)
    else:
        runner, hit, notes = _provider_cache(key, kind, runnable, engine_target, strict)
    _first_run(runner, feeds)
    seconds = time.perf_counter() - start
    runner.target = target
    if uncached is None:  # an entry that keeps no graph records no compile times
        record_compile(key, seconds=seconds, hit=hit)
    return runner, CacheUse(key, hit, seconds, notes, uncached)


def save_optimized(model: Model, target: Target, path, *, purpose: str = "the compile cache") -> str:
    """Write ONNX Runtime's graph of ``model`` optimized for ``target`` to ``path`` (checked, atomically); the
    optimization level used. What the compile cache and an artifacts directory (``onnxaccel compile``) keep."""
    max_ir, max_opset = runtime_limits()
    readable = model.for_runtime(max_ir, max_opset, f"onnxruntime {ort_version()}")
    # 'all' for the CPU this cache is keyed to (the host is in the key); CUDA takes extended rewrites.
    level = "all" if target.device == "cpu" else "extended"
    optimized = ort_optimize(onnx.load(str(readable.path)), level, target.provider)
    save_model(optimized, path, converter=f"ONNX Runtime graph optimization ({level}) for {purpose}")
    return level


def _ort_optimized(key: CompileKey, model: Model, target: Target, strict: bool):
    entry = key.entry
    path = entry / OPTIMIZED_FILE
    if (entry / UNCACHEABLE_FILE).is_file():
        return _uncached(model, target, strict, (entry / UNCACHEABLE_FILE).read_text().strip())
    hit = path.exists()
    notes = []
    if not hit:
        try:
            level = save_optimized(model, target, path)
        except CheckerError as exc:  # ORT's graph fails the full check: nothing was written (I/O errors raise)
            return _uncacheable(entry, model, target, strict, exc.message)
        notes.append(f"optimized at level '{level}' and saved to {path}")
    cached = dataclasses.replace(model, path=path, proto=onnx.load(str(path), load_external_data=False))
    # The saved graph is already optimized: skip the optimizer on load (that is what the cache saves).
    try:
        runner = compile_model(cached, target.with_options({"graph_optimization_level": "disable"}), strict=strict)
    except InferenceError as exc:
        if hit:  # it loaded when it was saved: a failure now (memory, the device) is not the graph's
            raise
        path.unlink(missing_ok=True)  # ORT cannot load the graph it just wrote
        return _uncacheable(entry, model, target, strict, exc.message)
    return runner, hit, notes, None


def _uncacheable(entry, model: Model, target: Target, strict: bool, why: str):
    """Some graphs ONNX Runtime optimizes cannot be saved and loaded again: on ONNX's own node cases, ORT 1.32
    names two inlined-function Casts alike (test_linear_attention_*: "Graph must be in single static assignment
    (SSA) form ... InsertedPrecisionFreeCast__inlfunc_LinearAttention_ScaleFactor") or writes FP16 Casts its
    loader refuses (test_qlinearmatmul_3D_int8_float16: "Type Error: Type (tensor(float16)) of output arg
    (InsertedPrecisionFreeCast_a_scale)"). The model itself runs: compile it as given, ORT optimizing at load,
    and remember (once that compile succeeds) that this entry cannot be cached."""
    result = _uncached(model, target, strict, why)
    try:  # atomically: a marker is whole or absent; one that cannot be written only costs the next start a retry
        entry.mkdir(parents=True, exist_ok=True)
        temporary = entry / f".{UNCACHEABLE_FILE}.{os.getpid()}"
        temporary.write_text(why + "\n")
        os.replace(temporary, entry / UNCACHEABLE_FILE)
    except OSError:
        pass
    return result


def _uncached(model: Model, target: Target, strict: bool, why: str):
    runner = compile_model(model, target, strict=strict)
    return runner, False, [f"compiled without the compile cache: ONNX Runtime's optimized graph of this model "
                           f"cannot be saved and loaded again ({why}); ONNX Runtime optimizes it at each load"], why


def _provider_cache(key: CompileKey, kind: str, model: Model, target: Target, strict: bool):
    """A provider that caches its own programs (the spec's compile_cache): point it at the entry's folder."""
    cache = providers.get(target.device).compile_cache
    folder = key.entry / cache.folder
    hit = folder.is_dir() and any(folder.glob(cache.glob))
    folder.mkdir(parents=True, exist_ok=True)
    runner = compile_model(model, target.with_options(cache.options_for(str(folder))), strict=strict)
    return runner, hit, []


def _first_run(runner: Runner, feeds: Mapping[str, np.ndarray] | None) -> None:
    if feeds is not None:
        runner.run(feeds)
