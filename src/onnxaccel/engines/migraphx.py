"""The native MIGraphX engine: AMD's graph compiler takes the whole ONNX model, with no ONNX Runtime around it.

    prog = migraphx.parse_onnx(path, default_dim_value=D, map_input_dims={input: bound shape})
    migraphx.quantize_fp16(prog) | quantize_bf16(prog) | quantize_int8(prog, gpu, calibration=[...])
    prog.compile(migraphx.get_target("gpu"), offload_copy=..., fast_math=..., exhaustive_tune=...)
    outputs = [np.array(a) for a in prog.run({input: array})]

(API and defaults: ROCm/AMDMIGraphX src/py/migraphx_py.cpp; rocm_facts.md §4. Quantization must come before
``compile``.) A compiled program has static shapes, so the runner keeps one program per set of input shapes,
and each goes through the engine's ``.mxr`` cache (``migraphx_cache``): a warm start loads the program with
``migraphx.load`` and skips parsing, quantization and compilation.

NOT EXECUTED ON AMD HARDWARE. The test suite runs this module against a real MIGraphX built from upstream
source with only its reference target (scripts/build-migraphx-ref; ``ONNXACCEL_MIGRAPHX_TARGET=ref`` points
the engine at ``get_target("ref")``): parsing, FP16/INT8 quantization, compile, run and the .mxr cache are
executed there, on the CPU. What needs a GPU (the "gpu" target, ``offload_copy=False``, ``to_gpu``/
``from_gpu``/``allocate_gpu``) is tested only against a stand-in module (tests/engines_migraphx/fake_migraphx)
held to the binding's source. Nothing here has run with real MIGraphX on a real AMD GPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnxaccel.engines.base import BoundRun, PlacedNode, Placement, Runner
from onnxaccel.engines.migraphx_cache import (
    ProgramCache, ProgramKey, calibration_fingerprint, native_runtime_versions, program_key,
)
from onnxaccel.engines.migraphx_setup import (
    TYPE_TO_NUMPY, MigraphxNotInstalledError, NativeOptions, check_device, import_migraphx, migraphx_target_name,
    migraphx_version, module_origin,
)
from onnxaccel.engines.ort_errors import diagnose
from onnxaccel.errors import (
    InferenceError, InputError, ModelFormatError, OnnxAccelError, PlacementError, ProviderUnavailableError,
    TargetError,
)
from onnxaccel.inputs import validate_feeds
from onnxaccel.model import Model
from onnxaccel.target import Target

#: The name this engine reports where ONNX Runtime reports execution providers.
NATIVE = "MIGraphX"
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
#: Parameters MIGraphX adds for output buffers when compiled with offload_copy=False
#: (src/targets/gpu/lowering.cpp / replace_allocate.cpp: mod.name() + ":#output_" + index).
OUTPUT_PARAM = "main:#output_"
_OFFLOAD_NOTE = ("bind() with offload_copy=1 (the default) keeps the inputs on the host: every run() copies "
                 "them to the GPU and the outputs back, inside MIGraphX. Use ?offload_copy=0 for device-resident "
                 "inputs and outputs.")


@dataclass
class ProgramBuild:
    """How one compiled program came to be: from the cache (``cache_hit``) or parsed, quantized, compiled."""

    shapes: dict[str, list[int]]
    cache_hit: bool
    seconds: float
    parse_seconds: float = 0.0
    quantize_seconds: float = 0.0
    compile_seconds: float = 0.0
    save_seconds: float = 0.0
    load_seconds: float = 0.0
    cache_path: str | None = None
    key: ProgramKey | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"shapes": self.shapes, "cache_hit": self.cache_hit, "seconds": self.seconds,
                "parse_seconds": self.parse_seconds, "quantize_seconds": self.quantize_seconds,
                "compile_seconds": self.compile_seconds, "save_seconds": self.save_seconds,
                "load_seconds": self.load_seconds, "cache_path": self.cache_path,
                "digest": self.key.digest if self.key else None, "key": self.key.to_dict() if self.key else None,
                "notes": list(self.notes)}


@dataclass
class _Program:
    prog: object
    #: input name -> dtype the compiled program wants (from get_parameter_shapes().type_string()).
    dtypes: dict[str, np.dtype | None]
    #: output-buffer parameters (offload_copy=False only), name -> migraphx.shape.
    output_params: dict[str, object]
    offload: bool
    build: ProgramBuild

    def cast(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for name, value in arrays.items():
            want = self.dtypes.get(name)
            out[name] = np.ascontiguousarray(value if want is None or value.dtype == want else value.astype(want))
        return out


class HostArguments:
    """``migraphx.argument`` objects for host arrays, and the arrays they point into.

    ``migraphx.argument(buffer)`` keeps only the buffer's address: its constructor is
    ``migraphx::argument(to_shape(info), info.ptr)`` with no ``py::keep_alive`` (ROCm/AMDMIGraphX
    src/py/migraphx_py.cpp at f729a52, held by tests/engines_migraphx/upstream/mgx_py_argument.txt). An
    argument made from a temporary (``np.ascontiguousarray`` of a strided array is a copy) points at freed
    memory as soon as the call returns. Keep this object alive for as long as MIGraphX may read the arguments.
    """

    def __init__(self, mgx, arrays: Mapping[str, np.ndarray]):
        self.buffers = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
        self.arguments = {k: mgx.argument(v) for k, v in self.buffers.items()}


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


def unsupported_operators(mgx, model: Model) -> Counter:
    """Operators of the model (subgraphs included) that ``migraphx.get_onnx_operators()`` does not list.

    Empty when this MIGraphX has no such function; then parse_onnx's "Unknown operator: X" says it."""
    lister = getattr(mgx, "get_onnx_operators", None)
    if lister is None:
        return Counter()
    known = set(lister())
    return Counter(op for op in _op_types(model.proto.graph) if op not in known)


def _op_types(graph):
    for node in graph.node:
        yield node.op_type
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _op_types(sub)


class MigraphxRunner(Runner):
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
        self._programs: dict[tuple, _Program] = {}
        self._run_lock = threading.Lock()    # one program object runs one eval at a time
        self._build_lock = threading.Lock()
        self._mgx_target = None
        self._noted_offload = False
        graph = model.proto.graph
        self.placement = Placement(NATIVE, {NATIVE: tuple(PlacedNode(n.op_type, n.name, n.domain)
                                                          for n in graph.node)}, method="parse_onnx")
        first = self._program(model.input_shapes)
        self.compile_seconds = first.build.seconds
        self.cache_hit = first.build.cache_hit

    @property
    def providers(self) -> list[str]:
        return [NATIVE]

    # -- running -----------------------------------------------------------------------------------------

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = self.host_inputs(feeds)
        program = self._program({k: v.shape for k, v in arrays.items()})
        params = program.cast(arrays)
        mgx = self.mgx
        with self._run_lock:
            try:
                if program.offload:
                    results = program.prog.run(params)
                else:
                    device = {k: mgx.to_gpu(mgx.argument(v)) for k, v in params.items()}
                    results = [mgx.from_gpu(r) for r in _run_on_device(mgx, program, device)]
            except Exception as exc:  # noqa: BLE001 - MIGraphX raises RuntimeError with its own text
                raise _inference_error(self.target, exc) from exc
        return self.to_numpy(results)

    def bind(self, feeds: Mapping[str, np.ndarray]) -> MigraphxBoundRun:
        bound = MigraphxBoundRun(self, feeds)
        if bound.program.offload and self.target_name == "gpu" and not self._noted_offload:
            self._noted_offload = True
            self.warnings.append(_OFFLOAD_NOTE)
        return bound

    def host_inputs(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Feeds checked against the signature (names, dtypes, rank, fixed dims); any size on symbolic
        dims (a new size compiles another program)."""
        return validate_feeds(dataclasses.replace(self.model, input_shapes={}), feeds)

    def to_numpy(self, results) -> dict[str, np.ndarray]:
        names = [o.name for o in self.model.outputs]
        if len(results) != len(names):
            raise InferenceError(f"MIGraphX returned {len(results)} output(s); the model declares {len(names)} "
                                 f"({', '.join(names)}).", "Report this with the model; --debug shows details.")
        out = {}
        for spec, arg in zip(self.model.outputs, results):
            value = np.array(arg)  # migraphx.argument exports the buffer protocol; np.array copies it
            want = _numpy_dtype(spec.dtype)
            if want is not None and value.dtype != want and value.dtype.kind == "f" and want.kind == "f":
                value = value.astype(want)  # e.g. a half output of a quantized program, back to the declared type
            out[spec.name] = value
        return out

    def close(self) -> None:
        self._programs.clear()

    # -- programs ----------------------------------------------------------------------------------------

    def _program(self, shapes: Mapping[str, Sequence[int]]) -> _Program:
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
                    self.warnings.append(f"new input shapes {_shape_text(wanted)}: "
                                         + ("loaded another program from the cache" if found.build.cache_hit else
                                            f"compiled another program in {found.build.seconds:.1f} s")
                                         + " (MIGraphX programs have static shapes)")
                self._programs[key] = found
        return found

    def _build(self, shapes: dict[str, tuple[int, ...]]) -> _Program:
        start = time.perf_counter()
        key = program_key(self.model, self.target, shapes, calibration=self._calibration_id(),
                          runtime=native_runtime_versions(self.version, module_origin(self.mgx), self.target_name))
        build = ProgramBuild({k: list(v) for k, v in shapes.items()}, False, 0.0, key=key)
        prog = self._load(key, shapes, build) if self.cache else None
        if prog is None:
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
        # Only the gpu target has device memory: a ref program takes and returns host buffers whatever
        # offload_copy says (src/targets/ref has no copy or allocation passes for it).
        return _describe_program(prog, build, self.options.offload_copy or self.target_name != "gpu")

    def _load(self, key: ProgramKey, shapes: dict, build: ProgramBuild):
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
            raise _parse_error(self.model, self.version, exc) from exc
        t1 = time.perf_counter()
        self._quantize(prog, shapes)
        t2 = time.perf_counter()
        target = self._target()
        try:
            prog.compile(target, **opts.compile_args())
        except Exception as exc:  # noqa: BLE001
            raise _compile_error(self.target, exc, self.target_name) from exc
        build.parse_seconds, build.quantize_seconds, build.compile_seconds = t1 - t0, t2 - t1, time.perf_counter() - t2
        return prog

    def _target(self):
        """``migraphx.get_target("gpu")`` (or "ref", see ``target_name``), once per runner."""
        if self._mgx_target is None:
            try:
                self._mgx_target = self.mgx.get_target(self.target_name)
            except Exception as exc:  # noqa: BLE001
                raise _compile_error(self.target, exc, self.target_name) from exc
        return self._mgx_target

    def _quantize(self, prog, shapes: dict[str, tuple[int, ...]]) -> None:
        """Precision by MIGraphX's own quantization passes, on the parsed program, before compile()."""
        mgx, precision = self.mgx, self.target.precision
        try:
            if precision == "fp16":
                mgx.quantize_fp16(prog)
            elif precision == "bf16":
                if not hasattr(mgx, "quantize_bf16"):
                    raise TargetError(f"MIGraphX {self.version} has no quantize_bf16.",
                                      "Use a newer ROCm/MIGraphX release, or /fp16.")
                mgx.quantize_bf16(prog)
            elif precision == "int8":
                held = [HostArguments(mgx, _rebatch(s, shapes)) for s in self._calibration_samples()]
                # ins_names stays at its default {"dot", "convolution"}: newer MIGraphX accepts exactly that set
                # ("QUANTIZE_INT8: only support DOT and CONVOLUTION operation", src/quantization.cpp).
                mgx.quantize_int8(prog, self._target(), calibration=[h.arguments for h in held])
                del held  # the buffers may go only now: quantize_int8 has read them
        except OnnxAccelError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise InferenceError(f"MIGraphX could not quantize {self.model.source} to {precision}: "
                                 f"{short_message(str(exc))}",
                                 "Try another precision, or run --target migraphx (ONNX Runtime's EP) to compare.",
                                 details=str(exc)) from exc

    # -- INT8 calibration --------------------------------------------------------------------------------

    def _calibration_id(self) -> str | None:
        if self.target.precision != "int8":
            return None
        if self._given_samples is not None:
            digest = hashlib.sha256()
            for sample in self._given_samples:
                for name in sorted(sample):
                    value = np.ascontiguousarray(sample[name])
                    digest.update(f"{name}{value.dtype}{value.shape}".encode())
                    digest.update(value.tobytes())
            return "given:" + digest.hexdigest()[:20]
        try:
            return calibration_fingerprint(self.options.calibration, self.options.calibration_samples)
        except OSError as exc:
            raise InputError(f"Calibration data not found: {self.options.calibration}",
                             "Give calibration=DIR_OF_IMAGES, FILE.npz, FILE.npy or synthetic.") from exc

    def _calibration_samples(self) -> list[dict[str, np.ndarray]]:
        if self._samples is None:
            if self._given_samples is not None:
                self._samples = self._given_samples
            else:
                # The loaders `onnxaccel optimize` uses (core: onnxaccel.calibration reads feeds like inputs).
                from onnxaccel.calibration import SYNTHETIC_WARNING, load_calibration

                data = load_calibration(self.options.calibration or "synthetic", self.model,
                                        max_samples=self.options.calibration_samples)
                if data.synthetic:
                    self.warnings.append(SYNTHETIC_WARNING)
                self._samples = data.samples
        return self._samples

    # -- reporting ---------------------------------------------------------------------------------------

    def programs(self) -> list[ProgramBuild]:
        return [p.build for p in self._programs.values()]

    def cache_use(self) -> dict:
        """The first program's cache use, in the shape of transform.compile_cache.CacheUse.to_dict()."""
        build = next(iter(self._programs.values())).build
        key = build.key
        return {"entry": str(self.cache.entry(key)) if self.cache and key else None,
                "digest": key.digest if key else None, "hit": build.cache_hit, "seconds": build.seconds,
                "key": key.to_dict() if key else None, "notes": list(build.notes)}

    def describe(self) -> dict:
        info = super().describe()
        info.update({"engine": "migraphx", "migraphx_version": self.version, "migraphx_target": self.target_name,
                     "options": self.options.to_dict(),
                     "cache_hit": self.cache_hit, "programs": [b.to_dict() for b in self.programs()]})
        return info


class MigraphxBoundRun(BoundRun):
    """Inputs and outputs for repeated runs at one set of shapes.

    With ``offload_copy=0`` the inputs live on the GPU (``migraphx.to_gpu``), the outputs are GPU buffers
    passed as the program's ``main:#output_N`` parameters (``allocate_gpu``) and ``outputs()`` copies them back
    (``from_gpu``). With ``offload_copy=1`` (MIGraphX's default) there is no device-resident path: the program
    copies host arrays in and out on every run, so timings include those copies.
    """

    def __init__(self, runner: MigraphxRunner, feeds: Mapping[str, np.ndarray]):
        self.runner = runner
        arrays = runner.host_inputs(feeds)
        self.shapes = {k: v.shape for k, v in arrays.items()}
        self.program = runner._program(self.shapes)
        self.host = {k: np.array(v, copy=True) for k, v in self.program.cast(arrays).items()}
        self.params: dict[str, object] = dict(self.host)
        if not self.program.offload:
            mgx = runner.mgx
            self.params = {k: mgx.to_gpu(mgx.argument(v)) for k, v in self.host.items()}
        self.results = None

    def update(self, feeds: Mapping[str, np.ndarray]) -> None:
        arrays = self.runner.host_inputs(feeds)
        changed = {k: (v.shape, self.shapes[k]) for k, v in arrays.items() if v.shape != self.shapes[k]}
        if changed:
            name, (got, want) = next(iter(changed.items()))
            raise InputError(f"update() got input '{name}' with shape {list(got)}; this binding is for "
                             f"{list(want)}.", "Call bind() again for other shapes.")
        for name, value in self.program.cast(arrays).items():
            np.copyto(self.host[name], value)
            if not self.program.offload:
                mgx = self.runner.mgx
                self.params[name] = mgx.to_gpu(mgx.argument(self.host[name]))

    def run(self) -> None:
        runner = self.runner
        with runner._run_lock:
            try:
                if self.program.offload:
                    self.results = self.program.prog.run(self.params)
                else:
                    self.results = _run_on_device(runner.mgx, self.program, self.params)
            except Exception as exc:  # noqa: BLE001
                raise _inference_error(runner.target, exc) from exc

    def outputs(self) -> dict[str, np.ndarray]:
        if self.results is None:
            self.run()
        results = self.results
        if not self.program.offload:
            results = [self.runner.mgx.from_gpu(r) for r in results]
        return self.runner.to_numpy(results)


def _run_on_device(mgx, program: _Program, inputs: Mapping[str, object]) -> list:
    """Run a program compiled with offload_copy=False: every parameter, output buffers too, on the GPU."""
    params = dict(inputs)
    for name, shape in program.output_params.items():
        params[name] = mgx.allocate_gpu(shape)
    results = program.prog.run(params)
    if hasattr(mgx, "gpu_sync"):
        mgx.gpu_sync()  # run() may return before the GPU is done; results are read or timed after this
    return results


def _describe_program(prog, build: ProgramBuild, offload: bool) -> _Program:
    dtypes, outputs = {}, {}
    for name, shape in prog.get_parameter_shapes().items():
        if name.startswith(OUTPUT_PARAM):
            outputs[name] = shape
        else:
            found = TYPE_TO_NUMPY.get(shape.type_string())
            dtypes[name] = np.dtype(found) if found is not None else None
    return _Program(prog, dtypes, dict(sorted(outputs.items())), offload, build)


def _rebatch(sample: Mapping[str, np.ndarray], shapes: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """Calibration samples are at the bound shapes; a program for another batch size gets their rows repeated."""
    out = {}
    for name, value in sample.items():
        want = tuple(shapes[name])
        if value.shape == want:
            out[name] = value
        elif value.ndim == len(want) and value.shape[1:] == want[1:] and value.shape[0] > 0:
            out[name] = value[np.arange(want[0]) % value.shape[0]]
        else:
            raise InferenceError(f"INT8 calibration samples for '{name}' have shape {list(value.shape)}; the "
                                 f"program being compiled takes {list(want)}.",
                                 "Bind the shapes you serve (--shape) so calibration data matches them.")
    return out


def _numpy_dtype(name: str) -> np.dtype | None:
    try:
        return np.dtype(name)
    except TypeError:
        return None


def _shape_text(shapes: Mapping[str, Sequence[int]]) -> str:
    return ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())


# -- errors -------------------------------------------------------------------------------------------------

#: MIGRAPHX_THROW prefixes its message with "<file>:<line>: <function>: " (src/include/migraphx/errors.hpp);
#: inside the Python binding's lambdas the function is "operator()" (the reference build's
#: ".../src/program.cpp:500: operator(): Parameter not found: x").
_SOURCE_CONTEXT = re.compile(r"^\S+\.[ch]pp:\d+: \S+: ")


def short_message(text: str) -> str:
    """MIGraphX's message without its source-location prefix: the first non-empty line."""
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return _SOURCE_CONTEXT.sub("", line)


def _parse_error(model: Model, version: str, exc: Exception) -> OnnxAccelError:
    text = str(exc)
    unknown = re.search(r"Unknown operator: (\S+)", text)  # onnx_parser.cpp parse_graph
    if unknown:
        return PlacementError(f"MIGraphX {version} cannot parse {model.source}: it has no parser for the ONNX "
                              f"operator {unknown.group(1)}.",
                              "Use --target migraphx (ONNX Runtime's MIGraphX EP runs such nodes on the CPU), or "
                              "replace the operator in the model.", details=text)
    if "Failed reading onnx file" in text:  # onnx_parser.cpp parse_from
        return ModelFormatError(f"MIGraphX could not read {model.path}: {short_message(text)}",
                                "Check that the file and its external data are readable ONNX.", details=text)
    return InferenceError(f"MIGraphX could not parse {model.source}: {short_message(text)}",
                          "Run `migraphx-driver read MODEL` for MIGraphX's own view; --debug shows the full error.",
                          details=text)


#: make_target dlopens "libmigraphx_<name>.so[.<so major>]" and throws dynamic_loader's dlerror text
#: (ROCm/AMDMIGraphX src/register_target.cpp and src/dynamic_loader.cpp at f729a52).
_NO_TARGET_LIBRARY = re.compile(r"(libmigraphx_(\w+)\.so[\w.]*): cannot open shared object file")


def _missing_target(text: str, name: str) -> OnnxAccelError | None:
    found = _NO_TARGET_LIBRARY.search(text)
    if not found:
        return None
    library, target_name = found.groups()
    if target_name == "gpu":
        hint = ("Install AMD's MIGraphX for ROCm (`sudo apt install migraphx` from AMD's repository, docs/AMD.md): "
                "its libmigraphx_gpu.so is the GPU target. A MIGraphX built without GPU support (such as "
                "scripts/build-migraphx-ref) has only the reference target; use --target migraphx (ONNX "
                "Runtime's MIGraphX EP) or --target cpu meanwhile.")
    else:
        hint = (f"Unset ONNXACCEL_MIGRAPHX_TARGET to compile for the GPU, or use a MIGraphX built with its "
                f"{name} target.")
    return ProviderUnavailableError(
        f"This MIGraphX has no '{target_name}' target: {library} is not installed with it.", hint, details=text)


def _compile_error(target: Target, exc: Exception, target_name: str = "gpu") -> OnnxAccelError:
    text = str(exc)
    missing = _missing_target(text, target_name)
    if missing is not None:
        return missing
    found = diagnose(text)
    if found:
        return ProviderUnavailableError(f"MIGraphX could not compile for the GPU: {found.cause}.", found.fix,
                                        details=text)
    return InferenceError(f"MIGraphX could not compile the model for {target}: {short_message(text)}",
                          "Run `onnxaccel doctor --target migraphx@migraphx`; --debug shows the full error.",
                          details=text)


def _inference_error(target: Target, exc: Exception) -> InferenceError:
    text = str(exc)
    found = diagnose(text)
    return InferenceError(f"MIGraphX failed while running on {target}: {short_message(text)}",
                          found.fix if found else "Check input shapes and dtypes (`onnxaccel inspect`); --debug "
                          "shows the full error.", details=text)


# -- readiness (doctor) ---------------------------------------------------------------------------------------

def probe(target: Target | None = None):
    """Compile and run a one-node program on the GPU (or on the target ONNXACCEL_MIGRAPHX_TARGET names):
    is the native engine usable here?

    Returns engines.ort.ProbeResult, like the ONNX Runtime probe, so ``doctor`` can show both alike."""
    from onnxaccel.engines.ort import ProbeResult

    try:
        mgx = import_migraphx()
    except MigraphxNotInstalledError as exc:
        return ProbeResult(False, [], exc.message, exc.hint, exc.details)
    from onnxaccel.engines.ort import _probe_model

    try:
        name = migraphx_target_name()
    except TargetError as exc:
        return ProbeResult(False, [], exc.message, exc.hint)
    x = np.array([[-1.0, 0.0, 2.0, -3.5]], dtype=np.float32)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "probe.onnx"
            path.write_bytes(_probe_model())
            prog = mgx.parse_onnx(str(path), map_input_dims={"x": [1, 4]})
            prog.compile(mgx.get_target(name))
            y = np.array(prog.run({"x": x})[0])
    except Exception as exc:  # noqa: BLE001 - MIGraphX's failure is the finding
        missing = _missing_target(str(exc), name)
        if missing is not None:
            return ProbeResult(False, [], missing.message, missing.hint, str(exc))
        found = diagnose(str(exc))
        return ProbeResult(False, [], found.cause if found else short_message(str(exc)),
                           found.fix if found else "Run `rocminfo` and check docs/AMD.md.", str(exc))
    if not np.array_equal(y, np.maximum(x, 0)):
        return ProbeResult(False, [NATIVE], f"a one-node program gave wrong results on the MIGraphX {name} target",
                           "Check the ROCm install (docs/AMD.md: one release for every component).", repr(y))
    return ProbeResult(True, [NATIVE], details=f"migraphx {migraphx_version(mgx)}, target {name}")
