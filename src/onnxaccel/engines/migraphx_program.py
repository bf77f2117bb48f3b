"""One compiled MIGraphX program and what runs it: how it was built, its parameters, bound inputs and outputs.

A MIGraphX program has static shapes; engines/migraphx.py's runner keeps one ``CompiledProgram`` per set of
input shapes and builds it (parse, quantize, compile, or load from the .mxr cache). This module holds what a
program needs once it exists: its build record, host/device arguments, the device-resident run and the
repeated-run binding. Split from engines/migraphx.py.

NOT EXECUTED ON AMD HARDWARE: ``offload_copy=False`` (``to_gpu``/``from_gpu``/``allocate_gpu``) is tested only
against the stand-in module (tests/engines/migraphx/fake_migraphx) held to the binding's source; the rest also
runs against the real reference-target build.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from onnxaccel.engines.base import BoundRun
from onnxaccel.engines.cache_key import CompileKey
from onnxaccel.engines.migraphx_errors import inference_error
from onnxaccel.engines.migraphx_setup import TYPE_TO_NUMPY
from onnxaccel.errors import InferenceError, InputError
from onnxaccel.model import Model

if TYPE_CHECKING:
    from onnxaccel.engines.migraphx import MigraphxRunner

#: Parameters MIGraphX adds for output buffers when compiled with offload_copy=False
#: (src/targets/gpu/lowering.cpp / replace_allocate.cpp: mod.name() + ":#output_" + index).
OUTPUT_PARAM = "main:#output_"


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
    key: CompileKey | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready form, as ``describe()`` and the CLI's --json report it."""
        return {"shapes": self.shapes, "cache_hit": self.cache_hit, "seconds": self.seconds,
                "parse_seconds": self.parse_seconds, "quantize_seconds": self.quantize_seconds,
                "compile_seconds": self.compile_seconds, "save_seconds": self.save_seconds,
                "load_seconds": self.load_seconds, "cache_path": self.cache_path,
                "digest": self.key.digest if self.key else None, "key": self.key.to_dict() if self.key else None,
                "notes": list(self.notes)}


@dataclass
class CompiledProgram:
    """A compiled ``migraphx.program`` with what running it needs: parameter dtypes, output buffers, offload mode."""

    prog: object
    #: input name -> dtype the compiled program wants (from get_parameter_shapes().type_string()).
    dtypes: dict[str, np.dtype | None]
    #: output-buffer parameters (offload_copy=False only), name -> migraphx.shape.
    output_params: dict[str, object]
    offload: bool
    build: ProgramBuild

    def cast(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The arrays in the dtypes the program takes (a quantized program may want half), contiguous."""
        out = {}
        for name, value in arrays.items():
            want = self.dtypes.get(name)
            out[name] = np.ascontiguousarray(value if want is None or value.dtype == want else value.astype(want))
        return out


class HostArguments:
    """``migraphx.argument`` objects for host arrays, and the arrays they point into.

    ``migraphx.argument(buffer)`` keeps only the buffer's address: its constructor is
    ``migraphx::argument(to_shape(info), info.ptr)`` with no ``py::keep_alive`` (ROCm/AMDMIGraphX
    src/py/migraphx_py.cpp at f729a52, held by tests/engines/migraphx/upstream/mgx_py_argument.txt). An
    argument made from a temporary (``np.ascontiguousarray`` of a strided array is a copy) points at freed
    memory as soon as the call returns. Keep this object alive for as long as MIGraphX may read the arguments.
    """

    def __init__(self, mgx, arrays: Mapping[str, np.ndarray]):
        self.buffers = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
        self.arguments = {k: mgx.argument(v) for k, v in self.buffers.items()}



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
        self.program = runner.program_for(self.shapes)
        self.host = {k: np.array(v, copy=True) for k, v in self.program.cast(arrays).items()}
        self.params: dict[str, object] = dict(self.host)
        if not self.program.offload:
            mgx = runner.mgx
            self.params = {k: mgx.to_gpu(mgx.argument(v)) for k, v in self.host.items()}
        self.results = None

    def update(self, feeds: Mapping[str, np.ndarray]) -> None:
        """New values at the bound shapes, copied into the same buffers (and to the GPU with ``offload_copy=0``)."""
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
        """Run the program once on the bound inputs; outputs stay where MIGraphX left them until ``outputs()``."""
        runner = self.runner
        with runner.run_lock:
            try:
                if self.program.offload:
                    self.results = self.program.prog.run(self.params)
                else:
                    self.results = run_on_device(runner.mgx, self.program, self.params)
            except Exception as exc:  # noqa: BLE001
                raise inference_error(runner.target, exc) from exc

    def outputs(self) -> dict[str, np.ndarray]:
        """The last run's outputs as numpy arrays (running once first if nothing ran yet)."""
        if self.results is None:
            self.run()
        results = self.results
        if not self.program.offload:
            results = [self.runner.mgx.from_gpu(r) for r in results]
        return self.runner.to_numpy(results)


def run_on_device(mgx, program: CompiledProgram, inputs: Mapping[str, object]) -> list:
    """Run a program compiled with offload_copy=False: every parameter, output buffers too, on the GPU."""
    params = dict(inputs)
    for name, shape in program.output_params.items():
        params[name] = mgx.allocate_gpu(shape)
    results = program.prog.run(params)
    if hasattr(mgx, "gpu_sync"):
        mgx.gpu_sync()  # run() may return before the GPU is done; results are read or timed after this
    return results


def describe_program(prog, build: ProgramBuild, offload: bool) -> CompiledProgram:
    """Read a compiled program's parameters: input dtypes, and the ``main:#output_N`` buffers it expects."""
    dtypes, outputs = {}, {}
    for name, shape in prog.get_parameter_shapes().items():
        if name.startswith(OUTPUT_PARAM):
            outputs[name] = shape
        else:
            found = TYPE_TO_NUMPY.get(shape.type_string())
            dtypes[name] = np.dtype(found) if found is not None else None
    return CompiledProgram(prog, dtypes, dict(sorted(outputs.items())), offload, build)


def rebatch(sample: Mapping[str, np.ndarray], shapes: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
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


def results_to_numpy(model: Model, results) -> dict[str, np.ndarray]:
    """MIGraphX's result arguments as numpy arrays named like the model's outputs, in their declared float type."""
    names = [o.name for o in model.outputs]
    if len(results) != len(names):
        raise InferenceError(f"MIGraphX returned {len(results)} output(s); the model declares {len(names)} "
                             f"({', '.join(names)}).", "Report this with the model; --debug shows details.")
    out = {}
    for spec, arg in zip(model.outputs, results):
        value = np.array(arg)  # migraphx.argument exports the buffer protocol; np.array copies it
        want = numpy_dtype(spec.dtype)
        if want is not None and value.dtype != want and value.dtype.kind == "f" and want.kind == "f":
            value = value.astype(want)  # e.g. a half output of a quantized program, back to the declared type
        out[spec.name] = value
    return out


def numpy_dtype(name: str) -> np.dtype | None:
    """The numpy dtype of an ONNX type name, None for names numpy does not know (e.g. bfloat16)."""
    try:
        return np.dtype(name)
    except TypeError:
        return None


def shape_text(shapes: Mapping[str, Sequence[int]]) -> str:
    """``x=1x3x224x224, y=1x10``: input shapes as the warnings print them."""
    return ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in shapes.items())


# -- errors -------------------------------------------------------------------------------------------------
