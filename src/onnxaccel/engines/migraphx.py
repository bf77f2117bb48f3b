"""The native MIGraphX engine: AMD's graph compiler takes the whole ONNX model, with no ONNX Runtime around it.

    prog = migraphx.parse_onnx(path, default_dim_value=D, map_input_dims={input: bound shape})
    migraphx.quantize_fp16(prog) | quantize_bf16(prog) | quantize_int8(prog, gpu, calibration=[...])
    prog.compile(migraphx.get_target("gpu"), offload_copy=..., fast_math=..., exhaustive_tune=...)
    outputs = [np.array(a) for a in prog.run({input: array})]

(API and defaults: ROCm/AMDMIGraphX src/py/migraphx_py.cpp. Quantization must come before ``compile``.) A compiled
program has static shapes, so the runner keeps one program per set of input shapes, and each goes through the
engine's ``.mxr`` cache (``migraphx_cache``): a warm start loads the program with ``migraphx.load`` and skips
parsing, quantization and compilation.

NOT EXECUTED ON AMD HARDWARE. The test suite runs this module against a real MIGraphX built from upstream
source with only its reference target (scripts/build-migraphx-ref; ``ONNXACCEL_MIGRAPHX_TARGET=ref`` points
the engine at ``get_target("ref")``): parsing, FP16/INT8 quantization, compile, run and the .mxr cache are
executed there, on the CPU. What needs a GPU (the "gpu" target, ``offload_copy=False``, ``to_gpu``/
``from_gpu``/``allocate_gpu``) is tested only against a stand-in module (tests/engines/migraphx/fake_migraphx)
held to the binding's source. Nothing here has run with real MIGraphX on a real AMD GPU.

Beside it: migraphx_program (programs, bound runs), migraphx_calibration (quantization), migraphx_errors,
migraphx_probe (doctor), migraphx_setup (import, options), migraphx_cache (.mxr).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

import numpy as np

from onnxaccel.engines.base import PlacedNode, Placement, ProbeResult, Runner
from onnxaccel.engines.build_counts import count_program
from onnxaccel.engines.cache_key import CompileKey
from onnxaccel.engines.migraphx_cache import ProgramCache, native_runtime_versions, program_key
from onnxaccel.engines.migraphx_calibration import calibration_id, load_samples, quantize
from onnxaccel.engines.migraphx_errors import compile_error, inference_error, parse_error, short_message
from onnxaccel.engines.migraphx_probe import probe
from onnxaccel.engines.migraphx_program import (
    CompiledProgram, MigraphxBoundRun, ProgramBuild, describe_program, results_to_numpy, run_on_device, shape_text,
    unsupported_operators,
)
from onnxaccel.engines.migraphx_setup import (
    NATIVE, NativeOptions, check_device, import_migraphx, migraphx_target_name, migraphx_version, module_origin,
)
from onnxaccel.errors import ArtifactError, PlacementError, TargetError
from onnxaccel.feeds_check import conform
from onnxaccel.model import Model
from onnxaccel.target import Target

PRECISIONS = ("fp32", "fp16", "bf16", "int8")
_OFFLOAD_NOTE = ("bind() with offload_copy=1 (the default) keeps the inputs on the host: every run() copies "
                 "them to the GPU and the outputs back, inside MIGraphX. Use ?offload_copy=0 for device-resident "
                 "inputs and outputs.")


class MigraphxEngine:
    """Compiles a Model for a ``migraphx@migraphx`` Target into a :class:`MigraphxRunner`."""

    name = "migraphx"

    def compile(self, model: Model, target: Target, *, strict: bool = False,
                calibration: Sequence[Mapping[str, np.ndarray]] | None = None) -> MigraphxRunner:
        """``calibration``: INT8 samples (one feed dict each, at the bound shapes); without it the target's
        ``calibration=`` option is read, else synthetic data is used and flagged. ``strict`` changes nothing:
        the native engine has no fallback, an operator it cannot parse is always an error."""
        mgx = import_migraphx()
        check_device(target)
        migraphx_target_name()  # a bad ONNXACCEL_MIGRAPHX_TARGET fails before any work
        if target.precision not in PRECISIONS:
            raise TargetError(f"The native MIGraphX engine has no precision '{target.precision}'.",
                              f"Use one of: {', '.join(PRECISIONS)}.")
        options = NativeOptions.from_target(target)
        if not model.is_bound:
            model = model.bind()
        missing = unsupported_operators(mgx, model)
        if missing:
            ops = ", ".join(f"{op} x{n}" for op, n in missing.most_common())
            raise PlacementError(
                f"MIGraphX {migraphx_version(mgx)} cannot parse {sum(missing.values())} node(s) of {model.source}: "
                f"{ops}.",
                "The native engine has no fallback. Use --target migraphx (ONNX Runtime's MIGraphX EP runs those "
                "nodes on the CPU and the rest on the GPU), or replace them in the model. "
                "`migraphx-driver onnx --list` prints the operators this MIGraphX parses.",
            )
        return MigraphxRunner(mgx, model, target, options, calibration=calibration)

    def probe(self, target: Target) -> ProbeResult:
        """A one-node program compiled and run on the engine's MIGraphX target (migraphx_probe.probe)."""
        return probe(target)

    def key_for(self, model: Model, target: Target) -> CompileKey:
        """The key of the first program :meth:`compile` builds (at the model's bound shapes) with the MIGraphX
        installed here: what an artifacts directory is checked against before a runner is built from it."""
        mgx = import_migraphx()
        bound = model if model.is_bound else model.bind()
        calibration = calibration_id(target.precision, None, NativeOptions.from_target(target))
        return program_key(bound, target, bound.input_shapes, runtime=native_runtime(mgx), calibration=calibration)


def native_runtime(mgx) -> dict[str, str]:
    """What builds a program besides the model, for the module ``mgx`` here (migraphx_cache.native_runtime_versions:
    version, build, ROCm, the MIGraphX target)."""
    return native_runtime_versions(migraphx_version(mgx), module_origin(mgx), migraphx_target_name())


class MigraphxRunner(Runner):
    """One model on MIGraphX: a compiled program per set of input shapes, each through the .mxr cache.

    Programs are built lazily under a lock (the first, at the bound shapes, here); ``run_lock`` lets one run at
    a time, as a MIGraphX program object is not known to be reentrant. Feeds are checked by the Runner template
    with fixed axes (a new shape would compile another program) and may come in any dtype that casts to the
    input's without loss."""

    casts_feeds = True
    checks_axes = True

    def __init__(self, mgx, model: Model, target: Target, options: NativeOptions, *,
                 calibration: Sequence[Mapping[str, np.ndarray]] | None = None):
        self.mgx = mgx
        self.model = model
        self.target = target
        self.options = options
        self.version = migraphx_version(mgx)
        #: "gpu", or "ref" where ONNXACCEL_MIGRAPHX_TARGET says so (tests and doctor on a build without GPU).
        self.target_name = migraphx_target_name()
        self.warnings = list(model.notes)
        self.cache = ProgramCache(options.model_cache_dir or None) if options.cache else None
        self._given_samples = [dict(s) for s in calibration] if calibration is not None else None
        self._samples: list[dict[str, np.ndarray]] | None = None
        self._programs: dict[tuple, CompiledProgram] = {}
        self.run_lock = threading.Lock()    # one program object runs one eval at a time
        self._build_lock = threading.Lock()
        self._mgx_target = None
        self._noted_offload = False
        graph = model.proto.graph
        self.placement = Placement(NATIVE, {NATIVE: tuple(PlacedNode(n.op_type, n.name, n.domain)
                                                          for n in graph.node)}, method="parse_onnx")
        first = self.program_for(model.input_shapes)
        self.compile_seconds = first.build.seconds
        self.cache_hit = first.build.cache_hit

    @property
    def providers(self) -> list[str]:
        """``["MIGraphX"]``: the native engine runs everything itself, there are no providers to fall back to."""
        return [NATIVE]

    # -- running -----------------------------------------------------------------------------------------

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once on host arrays (a new set of shapes builds another program first); outputs as numpy arrays."""
        arrays = self.host_inputs(feeds)
        program = self.program_for({k: v.shape for k, v in arrays.items()})
        params = program.cast(arrays)
        mgx = self.mgx
        with self.run_lock:
            try:
                if program.offload:
                    results = program.prog.run(params)
                else:
                    device = {k: mgx.to_gpu(mgx.argument(v)) for k, v in params.items()}
                    results = [mgx.from_gpu(r) for r in run_on_device(mgx, program, device)]
            except Exception as exc:  # noqa: BLE001 - MIGraphX raises RuntimeError with its own text
                raise inference_error(self.target, exc) from exc
        return self.to_numpy(results)

    def _bind(self, feeds: Mapping[str, np.ndarray]) -> MigraphxBoundRun:
        """Inputs placed once for repeated runs (on the GPU with ``offload_copy=0``); else notes the host copies."""
        bound = MigraphxBoundRun(self, feeds)
        if bound.program.offload and self.target_name == "gpu" and not self._noted_offload:
            self._noted_offload = True
            self.warnings.append(_OFFLOAD_NOTE)
        return bound

    def host_inputs(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The feeds (checked by the Runner template) as C-contiguous arrays of their inputs' dtypes, in model
        order; a cast only where no value changes (feeds_check.conform). Any size on symbolic dims (a new size
        compiles another program)."""
        return {s.name: conform(feeds[s.name], s.np_dtype, s.name) for s in self.model.inputs}

    def to_numpy(self, results) -> dict[str, np.ndarray]:
        """MIGraphX's result arguments as numpy arrays named like the model's outputs, in their declared float type."""
        return results_to_numpy(self.model, results)

    def close(self) -> None:
        """Drop the compiled programs (and with them their device memory)."""
        self._programs.clear()

    # -- programs ----------------------------------------------------------------------------------------

    def program_for(self, shapes: Mapping[str, Sequence[int]]) -> CompiledProgram:
        """The program for these input shapes, built (or loaded from the cache) on first use, once, under a lock."""
        key = tuple((s.name, tuple(int(d) for d in shapes[s.name])) for s in self.model.inputs)
        found = self._programs.get(key)
        if found is not None:
            return found
        with self._build_lock:
            found = self._programs.get(key)
            if found is None:
                wanted = dict(key)
                if self._programs:
                    self.model.bind(wanted)  # a shared symbolic dim bound to two sizes fails here, with a hint
                found = self._build(wanted)
                if self._programs:
                    self.warnings.append(f"new input shapes {shape_text(wanted)}: "
                                         + ("loaded another program from the cache" if found.build.cache_hit else
                                            f"compiled another program in {found.build.seconds:.1f} s")
                                         + " (MIGraphX programs have static shapes)")
                self._programs[key] = found
        return found

    def _build(self, shapes: dict[str, tuple[int, ...]]) -> CompiledProgram:
        start = time.perf_counter()
        key = program_key(self.model, self.target, shapes, calibration=self._calibration_id(),
                          runtime=native_runtime(self.mgx))
        build = ProgramBuild({k: list(v) for k, v in shapes.items()}, False, 0.0, key=key)
        prog = self._load(key, shapes, build) if self.cache else None
        if prog is None:
            if self.cache is not None and self.cache.read_only:  # an artifacts directory: never compile here
                raise self.cache.missing(key)
            prog = self._compile(shapes, build)
            if self.cache:
                t0 = time.perf_counter()
                try:
                    path = self.cache.store(key, lambda p: self.mgx.save(prog, p, format="msgpack"))
                    build.cache_path = str(path)
                except Exception as exc:  # noqa: BLE001 - a cache that cannot be written must not stop the run
                    build.notes.append(f"could not save the compiled program: {short_message(str(exc))}")
                    self.warnings.append(build.notes[-1])
                build.save_seconds = time.perf_counter() - t0
        build.seconds = time.perf_counter() - start
        if self.cache:
            self.cache.record(key, seconds=build.seconds, hit=build.cache_hit)
        count_program(loaded=build.cache_hit)
        # Only the gpu target has device memory: a ref program takes and returns host buffers whatever
        # offload_copy says (src/targets/ref has no copy or allocation passes for it).
        return describe_program(prog, build, self.options.offload_copy or self.target_name != "gpu")

    def _load(self, key: CompileKey, shapes: dict, build: ProgramBuild):
        path = self.cache.lookup(key)
        if path is None:
            return None
        t0 = time.perf_counter()
        try:
            prog = self.mgx.load(str(path), format="msgpack")
            params = prog.get_parameter_shapes()
            for name, dims in shapes.items():
                if name not in params or list(params[name].lens()) != list(dims):
                    raise RuntimeError(f"parameter {name} is not {list(dims)} in the cached program")
        except Exception as exc:  # noqa: BLE001 - a damaged or foreign cache entry is rebuilt, not fatal
            if self.cache.read_only:  # ... except in an artifacts directory, which is never written
                raise ArtifactError(f"The saved MIGraphX program {path} does not load: {short_message(str(exc))}.",
                                    "Run onnxaccel compile again into a fresh directory on a machine like this "
                                    "one.") from exc
            self.cache.discard(key)
            build.notes.append(f"discarded the cached program {path} ({short_message(str(exc))}); recompiling")
            self.warnings.append(build.notes[-1])
            return None
        build.cache_hit, build.cache_path, build.load_seconds = True, str(path), time.perf_counter() - t0
        return prog

    def _compile(self, shapes: dict[str, tuple[int, ...]], build: ProgramBuild):
        mgx, opts = self.mgx, self.options
        t0 = time.perf_counter()
        try:
            prog = mgx.parse_onnx(str(self.model.path), default_dim_value=opts.default_dim_value,
                                  map_input_dims={k: [int(d) for d in v] for k, v in shapes.items()})
        except Exception as exc:  # noqa: BLE001
            raise parse_error(self.model, self.version, exc) from exc
        t1 = time.perf_counter()
        self._quantize(prog, shapes)
        t2 = time.perf_counter()
        target = self._target()
        try:
            prog.compile(target, **opts.compile_args())
        except Exception as exc:  # noqa: BLE001
            raise compile_error(self.target, exc, self.target_name) from exc
        build.parse_seconds, build.quantize_seconds, build.compile_seconds = t1 - t0, t2 - t1, time.perf_counter() - t2
        return prog

    def _target(self):
        """``migraphx.get_target("gpu")`` (or "ref", see ``target_name``), once per runner."""
        if self._mgx_target is None:
            try:
                self._mgx_target = self.mgx.get_target(self.target_name)
            except Exception as exc:  # noqa: BLE001
                raise compile_error(self.target, exc, self.target_name) from exc
        return self._mgx_target

    def _quantize(self, prog, shapes: dict[str, tuple[int, ...]]) -> None:
        """Precision by MIGraphX's own quantization passes, on the parsed program, before compile()."""
        quantize(self.mgx, prog, self.target.precision, shapes, version=self.version, source=self.model.source,
                 target=self._target, samples=self._calibration_samples)

    def _calibration_id(self) -> str | None:
        return calibration_id(self.target.precision, self._given_samples, self.options)

    def _calibration_samples(self) -> list[dict[str, np.ndarray]]:
        if self._samples is None:
            self._samples = (self._given_samples if self._given_samples is not None
                             else load_samples(self.options, self.model, self.warnings))
        return self._samples

    # -- reporting ---------------------------------------------------------------------------------------

    def programs(self) -> list[ProgramBuild]:
        """How each program built so far came to be, in the order they were built."""
        return [p.build for p in self._programs.values()]

    def cache_use(self) -> dict:
        """The first program's cache use, in the shape of transform.compile_cache.CacheUse.to_dict()."""
        build = next(iter(self._programs.values())).build
        key = build.key
        return {"entry": str(self.cache.entry(key)) if self.cache and key else None,
                "digest": key.digest if key else None, "hit": build.cache_hit, "seconds": build.seconds,
                "key": key.to_dict() if key else None, "notes": list(build.notes)}

    def describe(self) -> dict:
        """The runner's report: the base fields plus MIGraphX's version, target, options and each program's build."""
        info = super().describe()
        info.update({"engine": "migraphx", "migraphx_version": self.version, "migraphx_target": self.target_name,
                     "options": self.options.to_dict(),
                     "cache_hit": self.cache_hit, "programs": [b.to_dict() for b in self.programs()]})
        return info


