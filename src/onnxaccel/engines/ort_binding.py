"""Running an ONNX Runtime session with its inputs and outputs on the device (IO binding), and the host values
of element types numpy lacks (bfloat16, float8, int4: ml_dtypes arrays built from their ONNX bits).

Split from engines/ort.py; ``onnxaccel.engines.ort`` re-exports :class:`OrtBoundRun`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from onnxaccel.engines.base import BoundRun
from onnxaccel.engines.ort_errors import diagnose, first_error_line, output_shape_mismatch
from onnxaccel.errors import InferenceError
from onnxaccel.target import Target

if TYPE_CHECKING:
    from onnxaccel.engines.ort import OrtRunner



class OrtBoundRun(BoundRun):
    """IO binding: inputs copied to the device once, outputs allocated there by ONNX Runtime.

    An output bound by device (``bind_output``) is allocated by the first run and reused by the next, which
    ONNX Runtime checks against the shape the graph declares: where the model returns another rank or another
    fixed dimension than it declares (an output declared ``[1, seqlen]`` that comes back ``24x1x8210``), the
    second run fails with "Invalid rank for output" (plain ONNX Runtime 1.32 does the same). Such outputs are
    found after the first run and bound anew before each later one, so ONNX Runtime allocates them per run
    (not with outputs bound to fixed OrtValues or graph capture, where a failure says what the model declares).

    Models with sequence, optional, map or string inputs or outputs are not IO-bound (ONNX Runtime binds
    tensors, and "Creation of OrtValues is currently only supported from non-string numpy arrays" on 1.32):
    they run through :meth:`OrtRunner.run` with host values instead, which gives the same results."""

    def __init__(self, runner: OrtRunner, feeds: Mapping[str, np.ndarray], *,
                 fixed_outputs: Mapping[str, tuple[tuple[int, ...], np.dtype]] | None = None):
        self.runner = runner
        ort = runner.ort
        self.device, self.device_id, self.vendor = _ortvalue_device(runner.target)
        self.output_names = [o.name for o in runner.session.get_outputs()]
        self.values = {}
        self._host_feeds: dict | None = None
        self._host_outputs: dict = {}
        #: Outputs whose declared shape the first run contradicted (name -> (declared, returned)): bound anew
        #: before every later run; None until a first run has been checked.
        self.untrusted: dict[str, tuple[str, tuple[int, ...]]] | None = None
        # Not with fixed outputs or graph capture: a replay writes where the capture wrote, so those stay bound.
        self._reusable = fixed_outputs is None and not runner.target.graph_capture
        if not all(s.is_tensor and s.elem_type != onnx.TensorProto.STRING
                   for s in (*runner.model.inputs, *runner.model.outputs)):
            self._host_feeds = dict(feeds)
            return
        self.binding = runner.session.io_binding()
        self._raw_outputs = {s.name for s in runner.model.outputs if is_raw_elem(s.elem_type)}
        self._raw_inputs = frozenset(s.name for s in runner.model.inputs if is_raw_elem(s.elem_type))
        for name, array in feeds.items():
            if name in self._raw_inputs:
                # Bound as a host OrtValue: ONNX Runtime copies it to the device for the run.
                self.values[name] = raw_ortvalue(ort, array)
            else:
                self.values[name] = _ortvalue(ort, _c_order(array), self.device, self.device_id, self.vendor)
            self.binding.bind_ortvalue_input(name, self.values[name])
        if fixed_outputs is None:
            self._bind_outputs_on_device()
            return
        # ORT's CUDA graph docs bind outputs to pre-allocated OrtValues (bind_ortvalue_output): a replay writes
        # where the capture wrote. They must be bound before the first run: with graph capture on, that run
        # already captures (InferenceSession::Run runs again at once "for necessary memory allocation or graph
        # capture"), into whatever outputs are bound then.
        self.fixed = [_ortvalue(ort, np.zeros(*fixed_outputs[name]), self.device, self.device_id, self.vendor)
                      for name in self.output_names]
        for name, value in zip(self.output_names, self.fixed):
            self.binding.bind_ortvalue_output(name, value)

    def _bind_outputs_on_device(self, names=None) -> None:
        for name in self.output_names if names is None else names:
            if name in self._raw_outputs:
                self.binding.bind_output(name, "cpu")  # read back from their bits, on the host
            elif self.vendor is not None:
                self.binding.bind_output(name, self.device, self.device_id, vendor_id=self.vendor)
            else:
                self.binding.bind_output(name, self.device, self.device_id)

    def update(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Copy new values into the bound inputs in place (same shapes; raw-typed inputs are bound anew)."""
        if self._host_feeds is not None:
            self._host_feeds.update(feeds)
            return
        for name, array in feeds.items():
            if name in self._raw_inputs:
                self.values[name] = raw_ortvalue(self.runner.ort, array)
                self.binding.bind_ortvalue_input(name, self.values[name])
            else:
                self.values[name].update_inplace(_c_order(array))

    def run(self) -> None:
        """One run on the bound values; outputs stay where they are bound."""
        if self._host_feeds is not None:
            self._host_outputs = self.runner.run_unchecked(self._host_feeds)  # checked when bound
            return
        if self.untrusted:
            self._bind_outputs_on_device(self.untrusted)  # dropped the last run's: ORT allocates them anew
        try:
            self.runner.session.run_with_iobinding(self.binding)
        except Exception as exc:  # noqa: BLE001
            raise inference_error(self.runner.target, exc, self.runner.model.outputs, self.untrusted) from exc
        if self.untrusted is None and self._reusable:
            self.untrusted = self._contradicted_outputs()

    def _contradicted_outputs(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The outputs of the first run whose rank or fixed dimensions differ from those the graph declares."""
        declared = {s.name: s for s in self.runner.model.outputs}
        found = {}
        for name, value in zip(self.output_names, self.binding.get_outputs()):
            spec = declared.get(name)
            if spec is None or spec.shape is None or not value.is_tensor():
                continue
            actual = tuple(value.shape())
            if len(actual) != len(spec.shape) or any(
                    isinstance(d, int) and d != a for d, a in zip(spec.shape, actual)):
                found[name] = (spec.shape_text(), actual)
        return found

    def outputs(self) -> dict[str, np.ndarray]:
        """The last run's outputs, copied to the host (raw-typed ones as ml_dtypes arrays)."""
        if self._host_feeds is not None:
            return dict(self._host_outputs)
        if not self._raw_outputs:
            return dict(zip(self.output_names, self.binding.copy_outputs_to_cpu()))
        return dict(zip(self.output_names, (host_value(v) for v in self.binding.get_outputs())))

    def input_addresses(self) -> dict[str, int] | None:
        """Device addresses of the bound inputs; None on the CPU and for models run with host values."""
        if self.device == "cpu" or self._host_feeds is not None:
            return None
        return {name: value.data_ptr() for name, value in self.values.items()}

    def device_outputs(self) -> list:
        """The OrtValues of the last run, still on the device."""
        return self.binding.get_outputs()


def _c_order(array) -> np.ndarray:
    """C-contiguous without losing 0-d shape (np.ascontiguousarray returns at least 1-d)."""
    array = np.asarray(array)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def is_raw_elem(elem_type: int) -> bool:
    """True for tensor element types numpy has no dtype of its own for (bfloat16, float8, int4/uint4, float4,
    int2): ONNX Runtime's Python binding neither takes nor returns them as numpy arrays: its numpy type map
    (microsoft/onnxruntime, onnxruntime/python/onnxruntime_pybind_mlvalue.cc, NumpyTypeToOnnxRuntimeType and
    OnnxRuntimeTensorToNumpyType) has no entry for them ("Numpy_type 256 can't be converted to MLDataType",
    "No corresponding Numpy type for Tensor Type. bfloat16" on 1.32.0; float8 comes back as uint8 bits)."""
    return elem_type in _RAW_ELEM_TYPES


_RAW_ELEM_TYPES = frozenset(
    getattr(onnx.TensorProto, n) for n in (
        "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4",
        "FLOAT4E2M1", "FLOAT8E8M0", "UINT2", "INT2") if hasattr(onnx.TensorProto, n))


def raw_ortvalue(ort, array):
    """A host OrtValue of an ml_dtypes array: allocated by ONNX Runtime with the ONNX type, filled with the
    array's ONNX bytes (onnx.numpy_helper packs int4/uint4 two to a byte, as ONNX Runtime stores them)."""
    if not isinstance(array, np.ndarray):
        return array
    proto = numpy_helper.from_array(array)
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), proto.data_type)
    data = proto.raw_data
    if len(data) != value.tensor_size_in_bytes():
        raise InferenceError(f"Cannot pass a {array.dtype} tensor of shape {list(array.shape)} to ONNX Runtime "
                             f"({len(data)} bytes, it expects {value.tensor_size_in_bytes()}).",
                             "Give the input as a .pb file written by onnx.numpy_helper.from_array.")
    ctypes.memmove(value.data_ptr(), data, len(data))
    return value


def host_value(value):
    """An output OrtValue as a host value: ml_dtypes arrays from the bits of types numpy lacks, else numpy."""
    if value is None:
        return None
    if value.is_tensor() and value.has_value():
        elem = _ELEM_OF_TYPE_TEXT.get(value.data_type())
        if elem is not None:
            # Read on the host: raw outputs are bound to "cpu" (OrtBoundRun) or returned there by run_with_ort_values.
            data = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
            proto = onnx.TensorProto(data_type=elem, dims=value.shape(), raw_data=data)
            return numpy_helper.to_array(proto)
    if not value.has_value():
        return None
    return value.numpy()


#: ONNX Runtime's type strings (OrtValue.data_type()) of the element types read from raw bits.
_ELEM_OF_TYPE_TEXT = {
    f"tensor({onnx.TensorProto.DataType.Name(t).lower().replace('_', '')})": t for t in _RAW_ELEM_TYPES}


def _ortvalue_device(target: Target) -> tuple[str, int, int | None]:
    device_id = target.device_id or 0
    if target.device in ("cuda", "tensorrt"):
        return "cuda", device_id, None
    if target.device in ("migraphx", "rocm"):
        # Newer ORT addresses AMD memory as a "gpu" device with AMD's PCI vendor id (0x1002,
        # OrtDeviceVendorId.AMD in onnxruntime_inference_collection.py); older builds with the ROCm/MIGraphX
        # EP map "cuda" to the HIP allocator. Not executed on AMD hardware here.
        return "gpu", device_id, 0x1002
    return "cpu", 0, None


def _ortvalue(ort, array: np.ndarray, device: str, device_id: int, vendor: int | None):
    if vendor is not None:
        try:
            return ort.OrtValue.ortvalue_from_numpy(array, device, device_id, vendor)
        except TypeError:  # ORT without vendor ids
            return ort.OrtValue.ortvalue_from_numpy(array, "cuda", device_id)
    return ort.OrtValue.ortvalue_from_numpy(array, device, device_id)


def inference_error(target: Target, exc: Exception, outputs=(), returned=None) -> InferenceError:
    """A failed run as our InferenceError: the runtime's first error line, and its fix where one is known.

    Where ONNX Runtime refused an output for not having the shape the graph declares, the message says so
    (output, declared shape, returned shape where known: ``outputs`` are the model's output specs, ``returned``
    name -> (declared text, returned shape) from an earlier run) and the error is marked explained: random input
    values are not the cause, so no hint blames them."""
    text = str(exc)
    mismatch = output_shape_mismatch(text)
    if mismatch is None:
        found = diagnose(text)
        return InferenceError(
            f"Inference failed on {target}: {first_error_line(text)}",
            found.fix if found else "Check input shapes and dtypes (`onnxaccel inspect`); --debug shows the full "
            "error.", details=text)
    name, what = mismatch
    declared = next((s.shape_text() for s in outputs if s.name == name), None)
    said = f"declares output '{name}' as {declared}" if declared else f"declares another {what} for output '{name}'"
    if returned and name in returned:
        said += f" but returns {'x'.join(map(str, returned[name][1])) or 'a scalar'}"
    error = InferenceError(
        f"Inference failed on {target}: the model {said} (ONNX Runtime: {first_error_line(text)})",
        "The model's declared output shape differs from what it returns: fix the output's shape in the graph "
        "(e.g. clear it and re-run shape inference), or run without IO binding (--no-iobinding) and graph capture.",
        details=text)
    error.explained = True
    return error
