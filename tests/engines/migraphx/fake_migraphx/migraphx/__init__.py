"""STAND-IN for AMD's ``migraphx`` Python module. This is NOT MIGraphX and runs nothing on a GPU.

It exists so the native engine's wiring can be tested on a machine without ROCm: it mirrors the documented
Python API closely enough that a wrong call fails here the way it would fail there, and it computes real
results by running the ONNX model with ONNX Runtime on the CPU, so tests can check numerics.

What it mirrors, and from where:

* Signatures, argument names, order and defaults: ROCm/AMDMIGraphX ``src/py/migraphx_py.cpp`` at f729a52,
  quoted in ../upstream/mgx_py_*.txt; test_stand_in_fidelity.py holds every callable the engine uses to the
  quoted ``py::arg`` lists, and test_real_ref_fidelity.py to the real module built from that commit
  (scripts/build-migraphx-ref): names, pybind11 signatures, and the outcome and text of the same calls.
  ``parse_onnx(filename, default_dim_value=0, default_dyn_dim_value=shape.dynamic_dimension(1, 1),
  dim_params={}, map_input_dims={}, map_dyn_input_dims={}, skip_unknown_operators=False,
  print_program_on_error=False, max_loop_iterations=10, limit_max_iterations=65535,
  use_debug_symbols=False)``; ``program.compile(t, offload_copy=True, fast_math=True, exhaustive_tune=False)``;
  ``quantize_fp16(prog, ins_names=["all"])``; ``quantize_int8(prog, t, calibration=[], ins_names={"dot",
  "convolution"})``; ``save(p, filename, format="msgpack")``; ``load(filename, format="msgpack")``;
  ``get_target(name)``; ``allocate_gpu(s, host=False)``, ``to_gpu(arg, host=False)``, ``from_gpu(arg)``,
  ``gpu_sync()`` (these four only in GPU builds: ``#ifdef HAVE_GPU``; the stand-in is their only test double).
* pybind11's argument conversion: ``filename`` must be ``str`` (no ``pathlib.Path``); bool parameters take
  bool/int, not strings; ``program.run`` takes a ``dict`` of buffers; ``calibration`` entries must be
  ``migraphx.argument`` objects (no implicit conversion is registered). A wrong type raises ``TypeError``
  ("incompatible function arguments"), as pybind11 does.
* Errors: C++ ``migraphx::exception`` derives from ``std::runtime_error`` and reaches Python as
  ``RuntimeError`` with ``"<file>:<line>: <function>: <message>"`` (src/include/migraphx/errors.hpp,
  MIGRAPHX_THROW; the function is ``operator()`` inside the binding's lambdas). Messages used here, each as the
  reference build prints it (test_real_ref_fidelity.py compares the same calls on both): ``Unknown operator: X``
  (onnx_parser.cpp), ``PARSE_FROM: Failed reading onnx file: F`` (onnx_parser.cpp), ``PARSE_ONNX_FROM: both
  default_dim_value and default_dyn_dim_valueset to non-default value`` (sic, onnx.cpp), ``Parameter not found:
  x`` and ``Incorrect shape {float_type, {1, 4}, {4, 1}} for parameter: x should be: float_type, {2, 4}, {4,
  1}`` (program.cpp generic_eval), ``QUANTIZE_INT8: only support DOT and CONVOLUTION operation``
  (quantization.cpp), ``Dynamic loading or symbol lookup failed with libmigraphx_X.so: cannot open shared
  object file: No such file or directory`` (get_target of a target whose library is absent:
  register_target.cpp, dynamic_loader.cpp), and load()'s answers to damaged or missing files.
* ``argument``: built from a buffer without copying and without keeping it alive: the binding stores the
  buffer's address only (``migraphx::argument(to_shape(info), info.ptr)``, no ``py::keep_alive``). The
  stand-in holds a weak reference to the numpy array that owns the memory and raises when an argument whose
  array is gone is read; the real module would read freed memory. It exports its data to numpy: the real class
  implements the PEP 3118 buffer protocol through pybind11 (``def_buffer``); a Python 3.11 class cannot, so
  this one exposes numpy's ``__array_interface__`` instead. ``np.array(arg)`` reads either; nothing else is
  offered (an ``argument`` has no ``.shape`` or ``.astype``). Reading a device argument on the host raises
  here; the real one would read a device pointer as host memory.
* Parameters of a program compiled with ``offload_copy=False`` include ``main:#output_N`` output buffers
  (src/targets/gpu: ``mod.name() + ":#output_" + index``); such a program takes and returns GPU arguments.

Stricter than the real module, to catch mistakes the real one would turn into crashes or silent garbage
(each labelled "stand-in" in its message): quantizing a compiled program, compiling twice, running an
uncompiled program, passing host buffers to an offload_copy=False program or device buffers to an
offload_copy=True one.

Numerics: fp32 is exact ONNX Runtime CPU output. fp16/bf16 round inputs and outputs to that type. int8
fake-quantizes every float input with the scale its calibration set gives (max |x| / 127) and clips, so results
depend on the calibration data as a real INT8 program's do. ``fast_math`` and ``exhaustive_tune`` change nothing
here.

Test controls (environment): FAKE_MIGRAPHX_NO_GPU=1 makes compiling for "gpu" fail like a machine without an AMD
GPU; FAKE_MIGRAPHX_OLD=1 removes quantize_bf16 and get_onnx_operators (older MIGraphX); FAKE_MIGRAPHX_COMPILE_S
adds that many seconds to every compile (to make compile time visible); FAKE_MIGRAPHX_LOG=path appends one line
per API call (for tests that run the CLI in a subprocess).
"""

from __future__ import annotations

import base64
import json
import os
import time
import weakref

import numpy as np

#: The real format (migraphx_py.cpp since rocm-6.3.0): "X.Y.Z.dev" plus "+tweak"; the tweak names the stand-in.
__version__ = "2.16.0.dev+stand-in"

#: Every API call, in order: (function, details). Tests read it to check ordering and cache behaviour.
_calls: list[tuple[str, dict]] = []

_TYPES = {  # numpy dtype -> migraphx shape type name
    np.dtype(np.float32): "float_type", np.dtype(np.float16): "half_type", np.dtype(np.float64): "double_type",
    np.dtype(np.int8): "int8_type", np.dtype(np.uint8): "uint8_type", np.dtype(np.int16): "int16_type",
    np.dtype(np.uint16): "uint16_type", np.dtype(np.int32): "int32_type", np.dtype(np.uint32): "uint32_type",
    np.dtype(np.int64): "int64_type", np.dtype(np.uint64): "uint64_type", np.dtype(np.bool_): "bool_type",
}
_NUMPY = {v: k for k, v in _TYPES.items()}
#: ONNX operators this stand-in "parses"; anything else is "Unknown operator" (real list: get_onnx_operators()).
_UNSUPPORTED = {"Unique", "StringNormalizer", "TfIdfVectorizer", "Det", "Multinomial"}


def _log(_func: str, **details) -> None:
    _calls.append((_func, details))
    path = os.environ.get("FAKE_MIGRAPHX_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps([_func, {k: str(v) for k, v in details.items()}]) + "\n")


def _throw(where: str, message: str) -> RuntimeError:
    # MIGRAPHX_THROW: make_source_context(__FILE__, __LINE__, __func__) + ": " + message
    return RuntimeError(f"/src/AMDMIGraphX/src/{where}: {message}")


def _incompatible(func: str, signature: str, got) -> TypeError:
    return TypeError(f"{func}(): incompatible function arguments. The following argument types are supported:\n"
                     f"    1. {signature}\n\nInvoked with: {got!r}")


def _as_bool(func: str, name: str, value) -> bool:
    if isinstance(value, (bool, int, np.bool_)):
        return bool(value)
    raise _incompatible(func, f"({name}: bool)", value)


# -- shape and argument -----------------------------------------------------------------------------------

class shape:  # noqa: N801 - the real class is lower case
    class dynamic_dimension:  # noqa: N801
        def __init__(self, min=0, max=0, optimals=None):  # noqa: A002 - the real argument names
            self.min, self.max, self.optimals = min, max, set(optimals or ())

        def is_fixed(self) -> bool:
            return self.min == self.max

        def __eq__(self, other):
            return isinstance(other, type(self)) and (self.min, self.max) == (other.min, other.max)

    def __init__(self, **kwargs):
        type_name = str(kwargs.get("type", "float"))
        self._type = type_name if type_name.endswith("_type") else type_name + "_type"
        if self._type not in _NUMPY:
            raise _throw("shape.cpp:1: parse_type", f"Invalid type: {type_name}")
        self._lens = tuple(int(d) for d in kwargs.get("lens", [1]))
        strides = kwargs.get("strides")
        self._strides = tuple(int(s) for s in strides) if strides is not None else _standard(self._lens)

    @classmethod
    def _of(cls, dtype, lens, strides=None) -> shape:
        out = cls(type=_TYPES[np.dtype(dtype)], lens=list(lens))
        if strides is not None:
            out._strides = tuple(strides)
        return out

    def type_string(self) -> str:
        return self._type

    def lens(self) -> list[int]:
        return list(self._lens)

    def strides(self) -> list[int]:
        return list(self._strides)

    def ndim(self) -> int:
        return len(self._lens)

    def elements(self) -> int:
        return int(np.prod(self._lens, dtype=np.int64))

    def type_size(self) -> int:
        return _NUMPY[self._type].itemsize

    def bytes(self) -> int:
        return self.elements() * self.type_size()

    def standard(self) -> bool:
        return self._strides == _standard(self._lens)

    def scalar(self) -> bool:
        return False

    def dynamic(self) -> bool:
        return False

    def __eq__(self, other):
        return isinstance(other, shape) and (self._type, self._lens, self._strides) == (
            other._type, other._lens, other._strides)

    def __ne__(self, other):
        return not self == other

    def __repr__(self) -> str:
        return f"{self._type}, {{{', '.join(map(str, self._lens))}}}, {{{', '.join(map(str, self._strides))}}}"


def _standard(lens) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(lens):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


def _buffer_array(value, func: str) -> np.ndarray:
    """What pybind11's py::buffer gives: the object's memory, not a copy."""
    if isinstance(value, argument):
        value._host_check()
        return value._data
    try:
        view = memoryview(value)
    except TypeError:
        raise RuntimeError(f"Unable to cast Python instance of type {type(value)} to C++ type 'pybind11::buffer'"
                           f" ({func})") from None
    return np.asarray(view)


def _incorrect_shape(got: shape, want: shape, name: str) -> RuntimeError:
    # program.cpp generic_eval: "Incorrect shape {" + to_string(arg shape) + "} for parameter: " + name +
    # " should be: " + to_string(parameter shape)
    return _throw("program.cpp:1: generic_eval", f"Incorrect shape {{{got!r}}} for parameter: {name} should be: "
                                                 f"{want!r}")


def _shape_of(arr: np.ndarray) -> shape:
    if arr.dtype not in _TYPES:
        raise _throw("py/migraphx_py.cpp:1: to_shape", f"MIGRAPHX PYTHON: Unsupported data type {arr.dtype.char}")
    strides = [s // arr.itemsize for s in arr.strides]
    return shape._of(arr.dtype, arr.shape, strides)


class argument:  # noqa: N801
    """A shape and an address. ``argument(buffer)`` stores the buffer's pointer and nothing that keeps the
    buffer alive (migraphx_py.cpp: ``migraphx::argument(to_shape(info), info.ptr)``, no ``py::keep_alive``).
    The stand-in holds only a weak reference to the numpy array that owns the memory: reading an argument
    whose memory was freed raises here, where the real module would read freed memory."""

    def __init__(self, b):
        if isinstance(b, (list, tuple, int, float, str)) or b is None:
            raise _incompatible("__init__", "migraphx.argument(arg0: buffer)", b)
        data = _buffer_array(b, "argument")
        self._device = False
        self._shape = _shape_of(data)
        self._ptr = int(data.__array_interface__["data"][0])
        self._strong, self._owner, self._interface = None, None, None
        if isinstance(b, argument):  # the buffer protocol of an argument: the same address, the same owner
            self._strong, self._owner, self._interface = b._strong, b._owner, b._interface
            return
        owner = _memory_owner(b)
        if owner is None:  # memory not owned by a numpy array (bytes, mmap): this stand-in cannot model it
            self._strong = data
        else:
            self._owner, self._interface = weakref.ref(owner), dict(data.__array_interface__)

    @classmethod
    def _make(cls, data: np.ndarray, device: bool) -> argument:
        """An argument that owns its memory (run() results, GPU buffers), as the C++ allocations do."""
        out = cls.__new__(cls)
        out._strong, out._owner, out._interface, out._device = data, None, None, device
        out._shape, out._ptr = _shape_of(data), int(data.__array_interface__["data"][0])
        return out

    @property
    def _data(self) -> np.ndarray:
        if self._strong is not None:
            return self._strong
        owner = self._owner()
        if owner is None:
            raise RuntimeError(
                "stand-in: the memory behind this migraphx.argument was freed. argument(buffer) keeps only the "
                "buffer's address (migraphx_py.cpp: migraphx::argument(to_shape(info), info.ptr)); the array it "
                "was made from must stay alive while MIGraphX reads it. The real module would read freed memory.")
        return np.asarray(_Borrowed(self._interface, owner))

    def _host_check(self) -> None:
        if self._device:
            raise RuntimeError("stand-in: this argument is in GPU memory; reading it on the host needs "
                               "migraphx.from_gpu(arg) first (the real module would read a device pointer)")

    @property
    def __array_interface__(self):
        self._host_check()
        return self._data.__array_interface__

    def get_shape(self) -> shape:
        return self._shape

    def tolist(self) -> list:
        self._host_check()
        return self._data.reshape(-1).tolist()

    def data_ptr(self) -> int:
        return self._ptr

    def __eq__(self, other):
        return isinstance(other, argument) and np.array_equal(self._data, other._data)

    def __ne__(self, other):
        return not self == other

    def __repr__(self) -> str:
        return "<device argument>" if self._device else ", ".join(map(str, self._data.reshape(-1)[:16]))


class _Borrowed:
    """A numpy view of memory whose owner is alive; holds the owner only while the view is in use."""

    def __init__(self, interface: dict, owner):
        self.__array_interface__ = interface
        self._owner = owner


def _memory_owner(value):
    """The numpy array that owns the memory of ``value`` (a view's base chain), or None if no array does."""
    if not isinstance(value, np.ndarray):
        return None
    while isinstance(value.base, np.ndarray):
        value = value.base
    return value if value.base is None else None


# -- targets ----------------------------------------------------------------------------------------------

class target:  # noqa: N801
    def __init__(self, name: str):
        self._name = name


def get_target(name):
    if not isinstance(name, str):
        raise _incompatible("get_target", "(arg0: str) -> migraphx.target", name)
    _log("get_target", name=name)
    # make_target dlopens libmigraphx_<name>.so (register_target.cpp); a target whose library is absent fails
    # there with dlerror()'s text (dynamic_loader.cpp), as the reference build does for "gpu" and "cpu".
    if name not in ("gpu", "ref"):
        raise _throw("dynamic_loader.cpp:48: check_load_error",
                     f"Dynamic loading or symbol lookup failed with libmigraphx_{name}.so: cannot open shared "
                     "object file: No such file or directory")
    return target(name)


# -- program ----------------------------------------------------------------------------------------------

class program:  # noqa: N801
    def __init__(self):
        self._model = b""
        self._params: dict[str, shape] = {}
        self._outputs: list[tuple[str, shape]] = []
        self._precision = "fp32"
        self._scales: dict[str, float] = {}
        self._compiled = None  # target name once compiled
        self._offload = True
        self._options: dict = {}
        self._session = None

    def get_parameter_names(self) -> list[str]:
        return list(self.get_parameter_shapes())

    def get_parameter_shapes(self) -> dict[str, shape]:
        params = dict(self._params)
        if self._compiled == "gpu" and not self._offload:
            for i, (_, s) in enumerate(self._outputs):
                params[f"main:#output_{i}"] = s
        return params

    def get_output_shapes(self) -> list[shape]:
        return [s for _, s in self._outputs]

    def is_compiled(self) -> bool:
        return self._compiled is not None

    def compile(self, t, offload_copy=True, fast_math=True, exhaustive_tune=False):
        if not isinstance(t, target):
            raise _incompatible("compile", "(self: migraphx.program, t: migraphx.target, offload_copy: bool = True,"
                                " fast_math: bool = True, exhaustive_tune: bool = False) -> None", t)
        offload_copy = _as_bool("compile", "offload_copy", offload_copy)
        fast_math = _as_bool("compile", "fast_math", fast_math)
        exhaustive_tune = _as_bool("compile", "exhaustive_tune", exhaustive_tune)
        _log("compile", target=t._name, offload_copy=offload_copy, fast_math=fast_math,
             exhaustive_tune=exhaustive_tune, precision=self._precision)
        if self._compiled is not None:
            raise RuntimeError("stand-in: compile() on a program that is already compiled")
        if t._name == "gpu" and os.environ.get("FAKE_MIGRAPHX_NO_GPU") == "1":
            # What HIP reports when no AMD GPU is visible (hipErrorNoDevice, "no ROCm-capable device is detected").
            raise _throw("targets/gpu/hip.cpp:1: get_device_id",
                         "hipGetDevice failed: hipErrorNoDevice: no ROCm-capable device is detected")
        time.sleep(float(os.environ.get("FAKE_MIGRAPHX_COMPILE_S", "0") or 0))
        self._outputs = self._infer_outputs()
        self._compiled, self._offload = t._name, offload_copy if t._name == "gpu" else True
        self._options = {"offload_copy": offload_copy, "fast_math": fast_math, "exhaustive_tune": exhaustive_tune}

    def run(self, params):
        if not isinstance(params, dict):
            raise _incompatible("run", "(self: migraphx.program, arg0: dict) -> list[migraphx.argument]", params)
        _log("run", names=sorted(params))
        if self._compiled is None:
            raise RuntimeError("stand-in: run() on a program that was never compiled")
        device = self._compiled == "gpu" and not self._offload
        feeds = {}
        for name, want in self.get_parameter_shapes().items():
            if name not in params:
                raise _throw("program.cpp:1: generic_eval", f"Parameter not found: {name}")
            value = params[name]
            on_device = isinstance(value, argument) and value._device
            if device and not on_device:
                raise RuntimeError(f"stand-in: parameter {name} is a host buffer but the program was compiled with "
                                   "offload_copy=False; pass migraphx.to_gpu(...) / allocate_gpu(...) arguments")
            if not device and on_device:
                raise RuntimeError(f"stand-in: parameter {name} is in GPU memory but the program copies host "
                                   "buffers itself (offload_copy=True)")
            arr = value._data if on_device else _buffer_array(value, "run")
            got = _shape_of(arr)
            if got != want:
                raise _incorrect_shape(got, want, name)
            feeds[name] = arr
        outputs = self._compute({k: v for k, v in feeds.items() if not k.startswith("main:#output_")})
        if device:
            results = []
            for i, value in enumerate(outputs):
                buffer = params[f"main:#output_{i}"]
                buffer._data[...] = value
                results.append(buffer)
            return results
        return [argument._make(np.ascontiguousarray(v), device=False) for v in outputs]

    def print(self) -> None:
        print(repr(self))

    def sort(self) -> None:
        pass

    def __repr__(self) -> str:
        params = ", ".join(f"@param:{k} -> {v!r}" for k, v in self._params.items())
        return f"module: \"main\" (stand-in, {self._precision}) {params}"

    # -- stand-in internals ------------------------------------------------------------------------------

    def _ort(self):
        if self._session is None:
            import onnxruntime as ort

            self._session = ort.InferenceSession(self._model, providers=["CPUExecutionProvider"])
        return self._session

    def _infer_outputs(self) -> list[tuple[str, shape]]:
        zeros = {k: np.zeros(s.lens(), dtype=_NUMPY[s.type_string()]) for k, s in self._params.items()}
        try:
            values = self._ort().run(None, zeros)
        except Exception as exc:  # noqa: BLE001 - MIGraphX would fail while computing shapes at compile time
            raise _throw("program.cpp:1: compile", f"compute_shape failed: {exc}") from exc
        names = [o.name for o in self._ort().get_outputs()]
        return [(n, shape._of(v.dtype, v.shape)) for n, v in zip(names, values)]

    def _compute(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        inputs = {k: self._emulate_in(k, v) for k, v in feeds.items()}
        return [self._emulate_out(v) for v in self._ort().run(None, inputs)]

    def _emulate_in(self, name: str, value: np.ndarray) -> np.ndarray:
        if value.dtype.kind != "f":
            return value
        if self._precision == "fp16":
            return value.astype(np.float16).astype(value.dtype)
        if self._precision == "bf16":
            return _bf16(value)
        if self._precision == "int8":
            scale = self._scales.get(name) or 1.0
            return (np.clip(np.round(value / scale), -128, 127) * scale).astype(value.dtype)
        return value

    def _emulate_out(self, value: np.ndarray) -> np.ndarray:
        if value.dtype.kind == "f" and self._precision == "fp16":
            return value.astype(np.float16).astype(value.dtype)
        if value.dtype.kind == "f" and self._precision == "bf16":
            return _bf16(value)
        return value

    def _state(self) -> dict:
        return {"model": base64.b64encode(self._model).decode(), "precision": self._precision,
                "scales": self._scales, "compiled": self._compiled, "offload": self._offload,
                "options": self._options,
                "params": {k: [s.type_string(), s.lens()] for k, s in self._params.items()},
                "outputs": [[n, s.type_string(), s.lens()] for n, s in self._outputs]}

    @classmethod
    def _from_state(cls, state: dict) -> program:
        prog = cls()
        prog._model = base64.b64decode(state["model"])
        prog._precision, prog._scales = state["precision"], state["scales"]
        prog._compiled, prog._offload, prog._options = state["compiled"], state["offload"], state["options"]
        prog._params = {k: shape(type=t, lens=lens) for k, (t, lens) in state["params"].items()}
        prog._outputs = [(n, shape(type=t, lens=lens)) for n, t, lens in state["outputs"]]
        return prog


def _bf16(value: np.ndarray) -> np.ndarray:
    as_f32 = np.ascontiguousarray(value, dtype=np.float32)
    return (as_f32.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32).astype(value.dtype)


# -- parsing ----------------------------------------------------------------------------------------------

def parse_onnx(filename, default_dim_value=0, default_dyn_dim_value=None, dim_params=None, map_input_dims=None,
               map_dyn_input_dims=None, skip_unknown_operators=False, print_program_on_error=False,
               max_loop_iterations=10, limit_max_iterations=65535, use_debug_symbols=False):
    signature = ("(filename: str, default_dim_value: int = 0, default_dyn_dim_value: migraphx.shape."
                 "dynamic_dimension = ..., dim_params: dict[str, migraphx.shape.dynamic_dimension] = {}, "
                 "map_input_dims: dict[str, list[int]] = {}, ...) -> migraphx.program")
    if not isinstance(filename, str):
        raise _incompatible("parse_onnx", signature, filename)
    if not isinstance(default_dim_value, int) or isinstance(default_dim_value, bool) or default_dim_value < 0:
        raise _incompatible("parse_onnx", signature, default_dim_value)
    dims = _check_dims(map_input_dims or {}, signature)
    _log("parse_onnx", filename=filename, default_dim_value=default_dim_value, map_input_dims=dims)
    if default_dyn_dim_value is None:
        default_dyn_dim_value = shape.dynamic_dimension(1, 1)
    if default_dim_value != 0 and default_dyn_dim_value != shape.dynamic_dimension(1, 1):
        raise _throw("onnx/onnx.cpp:1: parse_onnx_from",
                     # sic: onnx.cpp joins two literals without a space
                     "PARSE_ONNX_FROM: both default_dim_value and default_dyn_dim_valueset to non-default value")
    if map_dyn_input_dims:
        raise NotImplementedError("stand-in: dynamic input dimensions (map_dyn_input_dims) are not emulated")
    import onnx
    from google.protobuf.message import DecodeError

    try:
        with open(filename, "rb") as handle:
            model = onnx.load_model_from_string(handle.read())
        if not model.HasField("graph"):
            raise DecodeError("no graph")
    except (OSError, DecodeError, ValueError) as exc:
        raise _throw("onnx/onnx_parser.cpp:1: parse_from",
                     f"PARSE_FROM: Failed reading onnx file: {filename}") from exc
    for node in model.graph.node:
        if node.op_type in _UNSUPPORTED and not skip_unknown_operators:
            raise _throw("onnx/onnx_parser.cpp:1: parse_graph", f"Unknown operator: {node.op_type}")
    onnx.load_external_data_for_model(model, os.path.dirname(os.path.abspath(filename)))
    initializers = {t.name for t in model.graph.initializer}
    prog = program()
    fallback = default_dim_value if default_dim_value > 0 else default_dyn_dim_value.max or 1
    for value in model.graph.input:
        if value.name in initializers:
            continue
        ttype = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type)
        if value.name in dims:
            lens = dims[value.name]
        else:
            lens = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else
                    _dim_param(dim_params or {}, d.dim_param, fallback) for d in ttype.shape.dim]
        prog._params[value.name] = shape._of(dtype, lens)
    prog._model = model.SerializeToString()
    return prog


def _dim_param(dim_params: dict, name: str, fallback: int) -> int:
    """dim_params maps a symbolic dim to a shape.dynamic_dimension; a fixed one {n, n} is a static size."""
    found = dim_params.get(name)
    if found is None:
        return fallback
    if not found.is_fixed():
        raise NotImplementedError("stand-in: dynamic dimensions (dim_params with min != max) are not emulated")
    return int(found.max)


def _check_dims(value, signature: str) -> dict[str, list[int]]:
    if not isinstance(value, dict):
        raise _incompatible("parse_onnx", signature, value)
    out = {}
    for key, dims in value.items():
        if not isinstance(key, str) or isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
            raise _incompatible("parse_onnx", signature, value)
        dims = list(dims)
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise _incompatible("parse_onnx", signature, value)
        out[key] = [int(d) for d in dims]
    return out


def get_onnx_operators() -> list[str]:
    import onnx

    return sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain == ""} - _UNSUPPORTED)


# -- quantization -----------------------------------------------------------------------------------------

def _check_program(func: str, prog) -> None:
    if not isinstance(prog, program):
        raise _incompatible(func, "(prog: migraphx.program, ...)", prog)
    if prog._compiled is not None:
        raise RuntimeError(f"stand-in: {func}() on a compiled program; quantization must come before compile()")


def quantize_fp16(prog, ins_names=("all",)):
    _check_program("quantize_fp16", prog)
    _log("quantize_fp16", ins_names=list(ins_names))
    prog._precision = "fp16"


def quantize_bf16(prog, ins_names=("all",)):
    _check_program("quantize_bf16", prog)
    _log("quantize_bf16", ins_names=list(ins_names))
    prog._precision = "bf16"


def quantize_int8(prog, t, calibration=(), ins_names=frozenset({"dot", "convolution"})):
    _check_program("quantize_int8", prog)
    if not isinstance(t, target):
        raise _incompatible("quantize_int8", "(prog: migraphx.program, t: migraphx.target, calibration: list["
                            "dict[str, migraphx.argument]] = [], ins_names: set[str] = {'dot', 'convolution'})", t)
    if not isinstance(calibration, (list, tuple)) or not all(
            isinstance(s, dict) and all(isinstance(k, str) and isinstance(v, argument) for k, v in s.items())
            for s in calibration):
        raise _incompatible("quantize_int8", "(prog: migraphx.program, t: migraphx.target, calibration: list["
                            "dict[str, migraphx.argument]] = [], ins_names: set[str] = {'dot', 'convolution'})",
                            calibration)
    if not isinstance(ins_names, (set, frozenset)):  # std::unordered_set: pybind11 converts only a set
        raise _incompatible("quantize_int8", "(prog: migraphx.program, t: migraphx.target, calibration: list["
                            "dict[str, migraphx.argument]] = [], ins_names: set[str] = {'dot', 'convolution'})",
                            ins_names)
    _log("quantize_int8", target=t._name, samples=len(calibration), ins_names=sorted(ins_names))
    if set(ins_names) != {"dot", "convolution"}:
        raise _throw("quantization.cpp:1: quantize_int8", "QUANTIZE_INT8: only support DOT and CONVOLUTION operation")
    # Real (src/quantization.cpp quantize_8bits): every sample runs through a compiled copy of the program; a
    # parameter the sample lacks gets t.allocate() (uninitialised memory, no error), a wrong shape fails in eval.
    for sample in calibration:
        for name, want in prog._params.items():
            if name in sample and sample[name].get_shape() != want:
                raise _incorrect_shape(sample[name].get_shape(), want, name)
    prog._precision = "int8"
    prog._scales = {}
    for name, want in prog._params.items():
        given = [s[name] for s in calibration if name in s]
        if _NUMPY[want.type_string()].kind == "f" and given:
            peak = max(float(np.max(np.abs(a._data))) for a in given)
            prog._scales[name] = peak / 127 if peak > 0 else 1.0


# -- save / load ------------------------------------------------------------------------------------------

#: A real msgpack program starts with a map header (0x85 in the reference build's files), not valid UTF-8.
_MSGPACK_MAGIC = b"\x85STAND-IN-MXR\n"
_JSON_KEY = "stand-in-mxr"
_FORMATS = ("msgpack", "json")


def save(p, filename, format="msgpack"):  # noqa: A002 - the real argument name
    if not isinstance(p, program) or not isinstance(filename, str):
        raise _incompatible("save", "(p: migraphx.program, filename: str, format: str = 'msgpack') -> None",
                            (p, filename))
    _log("save", filename=filename, format=format)
    if format not in _FORMATS:
        raise _throw("load_save.cpp:99: save_buffer", f"Unknown format: {format}")
    body = json.dumps(p._state()).encode()
    with open(filename, "wb") as handle:
        handle.write(_MSGPACK_MAGIC + body if format == "msgpack" else json.dumps({_JSON_KEY: p._state()}).encode())


def load(filename, format="msgpack"):  # noqa: A002
    """The reference build's answers: a missing file, an unknown format, damaged msgpack ("Not an object for
    field: version", or "insufficient bytes" when it ends early), and a msgpack file read as json
    (UnicodeDecodeError: the message quotes the bytes, which pybind11 cannot decode)."""
    if not isinstance(filename, str):
        raise _incompatible("load", "(filename: str, format: str = 'msgpack') -> migraphx.program", filename)
    _log("load", filename=filename, format=format)
    try:
        with open(filename, "rb") as handle:
            data = handle.read()
    except OSError:
        raise _throw("file_buffer.cpp:38: generic_read_file", f"Failure opening file: {filename}") from None
    if format not in _FORMATS:
        raise _throw("load_save.cpp:56: load_buffer", f"Unknown format: {format}")
    if format == "json":
        text = data.decode("utf-8")
        try:
            return program._from_state(json.loads(text)[_JSON_KEY])
        except (ValueError, KeyError, TypeError):
            raise _throw("value.cpp:371: at", "Not an object for field: version") from None
    if not data.startswith(_MSGPACK_MAGIC):
        if len(data) < 2 or data[:1] in (b"\x92", b"\x93", b"\xdc"):
            raise RuntimeError("insufficient bytes")  # msgpack-c's own exception: no source context
        raise _throw("value.cpp:371: at", "Not an object for field: version")
    try:
        return program._from_state(json.loads(data[len(_MSGPACK_MAGIC):]))
    except (ValueError, KeyError):
        raise RuntimeError("insufficient bytes") from None


# -- GPU memory (HAVE_GPU builds) ---------------------------------------------------------------------------

def allocate_gpu(s, host=False):
    if not isinstance(s, shape):
        raise _incompatible("allocate_gpu", "(s: migraphx.shape, host: bool = False) -> migraphx.argument", s)
    return argument._make(np.zeros(s.lens(), dtype=_NUMPY[s.type_string()]), device=not host)


def to_gpu(arg, host=False):
    if not isinstance(arg, argument):
        raise _incompatible("to_gpu", "(arg: migraphx.argument, host: bool = False) -> migraphx.argument", arg)
    arg._host_check()
    return argument._make(np.array(arg._data, copy=True), device=not host)


def from_gpu(arg):
    if not isinstance(arg, argument):
        raise _incompatible("from_gpu", "(arg0: migraphx.argument) -> migraphx.argument", arg)
    return argument._make(np.array(arg._data, copy=True), device=False)


def gpu_sync():
    _log("gpu_sync")


if os.environ.get("FAKE_MIGRAPHX_OLD") == "1":
    del quantize_bf16, get_onnx_operators
