"""The ONNX Runtime engine: build a session for a target, verify where it really runs, run it.

ONNX Runtime's failure modes differ by provider (rocm_facts.md §1.4, §7): MIGraphX raises when its
libraries are missing, CUDA and ROCm log an error and silently run on the CPU. So after building the
session this engine checks ``get_providers()`` and the node placement, and turns a silent fallback into a
loud one.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import json
import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata

import numpy as np
import onnx
from onnx import helper, numpy_helper
from packaging.version import Version

from onnxaccel.engines.base import CPU, BoundRun, PlacedNode, Placement, Runner
from onnxaccel.engines.ort_ep_options import EpOptions, check_int8_source, ep_environment, migraphx_options
from onnxaccel.engines.ort_errors import diagnose, first_error_line
from onnxaccel.engines.ort_flavour import installed_build
from onnxaccel.errors import (
    InferenceError,
    MissingDependencyError,
    ModelVersionError,
    OnnxAccelError,
    PlacementError,
    ProviderOptionError,
    ProviderUnavailableError,
    TargetError,
)
from onnxaccel.model import Model
from onnxaccel.target import PROVIDER_PACKAGE, Target

#: onnxruntime distributions that all install the same `onnxruntime` module (two of them conflict).
ORT_DISTRIBUTIONS = (
    "onnxruntime", "onnxruntime-gpu", "onnxruntime-migraphx", "onnxruntime-rocm", "onnxruntime-openvino",
    "onnxruntime-directml", "onnxruntime-qnn", "onnxruntime-training", "ort-nightly", "ort-nightly-gpu",
    "onnxruntime-cann", "onnxruntime-vitisai", "onnxruntime-silicon",
)
#: ORT version that deleted the ROCm EP (microsoft/onnxruntime#25181).
ROCM_EP_REMOVED = Version("1.23")
#: ORT version that added get_provider_graph_assignment_info (microsoft/onnxruntime#26781).
ASSIGNMENT_INFO_SINCE = Version("1.24")

_GRAPH_OPT = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
              "layout": "ORT_ENABLE_LAYOUT", "all": "ORT_ENABLE_ALL"}


def import_ort():
    """Import onnxruntime, or say which extra installs it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "cpu", "Running models with ONNX Runtime") from exc
    return onnxruntime


def ort_version() -> Version:
    return Version(import_ort().__version__.split("+")[0])


def installed_distributions() -> dict[str, str]:
    """Every installed distribution that provides the `onnxruntime` module, with its version."""
    found = {}
    for name in ORT_DISTRIBUTIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


@functools.lru_cache(maxsize=1)
def runtime_limits() -> tuple[int, int]:
    """(max IR version, max ai.onnx opset) the installed runtime reads, learned from its own errors.

    ONNX Runtime answers a model stamped with an impossible version with "max supported IR version: N"
    and "Current official support for domain ai.onnx is till opset N" (seen on 1.31/1.32).
    """
    ort = import_ort()
    import re

    def probe(ir: int, opset: int) -> str:
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], "probe",
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = ir
        try:
            ort.InferenceSession(model.SerializeToString(), providers=[CPU])
        except Exception as exc:  # noqa: BLE001 - we read the runtime's own message
            return str(exc)
        return ""

    ir_msg = probe(1000, 13)
    found = re.search(r"max supported IR version: (\d+)", ir_msg)
    max_ir = int(found.group(1)) if found else onnx.IR_VERSION
    op_msg = probe(7, 1000)
    found = re.search(r"ai\.onnx is till opset (\d+)", op_msg)
    max_opset = int(found.group(1)) if found else onnx.defs.onnx_opset_version()
    return max_ir, max_opset


class OrtEngine:
    """Compiles a Model for a Target into an :class:`OrtRunner`."""

    name = "ort"

    def compile(self, model: Model, target: Target, *, strict: bool = False) -> OrtRunner:
        ort = import_ort()
        version = ort_version()
        if target.engine != "ort":
            raise TargetError(f"{target} is not an ONNX Runtime target.", "Drop the @engine suffix.")
        check_int8_source(target, model.proto)  # before availability: the refusal holds on any machine
        _check_provider_built(ort, target, version)
        if not target.precision_is_native:
            raise TargetError(
                f"{target.device} has no {target.precision} switch of its own; the model must be converted first.",
                f"Use `onnxaccel run --precision {target.precision}` (converts the model), or `onnxaccel optimize`.",
            )
        max_ir, max_opset = runtime_limits()
        runnable = model.for_runtime(max_ir, max_opset, f"onnxruntime {version}")
        if not runnable.is_bound:
            runnable = runnable.bind()
        return OrtRunner(runnable, target, strict=strict)


class OrtRunner(Runner):
    def __init__(self, model: Model, target: Target, *, strict: bool = False):
        self.ort = import_ort()
        self.model = model
        self.target = target
        self.warnings = list(model.notes)
        self.version = ort_version()
        self._strict = strict
        # Options in the installed build's spelling, ORT_MIGRAPHX_* settings it reads only from the environment.
        self._ep = ep_options(target, model.proto)
        self.warnings.extend(self._ep.notes)
        #: ORT_MIGRAPHX_* settings this build reads only from the environment; every session built for the same
        #: run (profile, placement) is built inside ``ep_environment(runner.provider_env)`` too.
        self.provider_env: dict[str, str] = dict(self._ep.env)
        self.session, self.compile_seconds, log = self._create_session()
        # Read once: get_outputs() builds new objects on every call (~1 µs each, measurable on tiny models).
        self._output_names = [o.name for o in self.session.get_outputs()]
        actual = self.session.get_providers()
        if actual[0] != target.provider:
            if runtime_log_severity() > 2:
                # Quiet sessions keep the session logger's reason for dropping the provider (e.g. a missing
                # libhipblas) out of the captured log: build it once more at warning level, captured, to say why.
                _, _, log = self._create_session(severity=2)
            raise _provider_failed(target, log, actual)
        self.placement = self._placement()
        if target.device != "cpu" and self.placement.fallback:
            message = f"{self.placement.summary()}. Fallback nodes run on the CPU and add host-device copies."
            if strict:
                raise PlacementError(
                    message,
                    "Run `onnxaccel inspect --target` to see every fallback node; drop --strict to accept them.",
                )
            self.warnings.append(message)

    # -- session ---------------------------------------------------------------------------------------

    def _session_options(self, severity: int | None = None):
        ort = self.ort
        so = ort.SessionOptions()
        # Fixed for the session's life: its runs log through a logger of this severity too (RunOptions'
        # run_log_severity_level defaults to -1, "use the log severity from the InferenceSession";
        # microsoft/onnxruntime include/onnxruntime/core/framework/run_options.h, 1.32). Quiet (4) also drops
        # the session logger's lines from the captured creation log; provider-load failures still reach it
        # through the default logger, which capture_native_stderr opens to warnings while it captures.
        so.log_severity_level = runtime_log_severity() if severity is None else severity
        _apply_default_logger(ort)
        if self.version >= ASSIGNMENT_INFO_SINCE:
            so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        for key, value in self.target.session_options().items():
            if key == "graph_optimization_level":
                so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _GRAPH_OPT[value])
            elif key == "execution_mode":
                so.execution_mode = getattr(ort.ExecutionMode, f"ORT_{value.upper()}")
            elif key in ("enable_mem_pattern", "enable_cpu_mem_arena"):
                setattr(so, key, value == "1")
            else:
                setattr(so, key, int(value))
        return so

    def _providers(self) -> list:
        provider = self.target.provider
        options = dict(self._ep.options)
        chain = [(provider, options)]
        if provider == "TensorrtExecutionProvider":
            chain.append(("CUDAExecutionProvider", {"device_id": options.get("device_id", "0")}))
        if provider != CPU:
            chain.append((CPU, {}))
        return chain

    def _create_session(self, severity: int | None = None):
        if self.target.device in ("cuda", "tensorrt") and hasattr(self.ort, "preload_dlls"):
            # Loads CUDA/cuDNN from pip's nvidia-* wheels when present; prints, never raises (ORT docs).
            with contextlib.redirect_stdout(io.StringIO()):
                with contextlib.suppress(Exception):
                    self.ort.preload_dlls()
        start = time.perf_counter()
        with capture_native_stderr() as log, ep_environment(self._ep.env):
            try:
                session = self.ort.InferenceSession(
                    str(self.model.path), self._session_options(severity), providers=self._providers(),
                    enable_fallback=0,
                )
            except Exception as exc:  # noqa: BLE001 - every runtime failure is translated below
                raise _session_error(self.target, self.model, exc, log.text()) from exc
        return session, time.perf_counter() - start, log.text()

    # -- placement -------------------------------------------------------------------------------------

    def _placement(self) -> Placement:
        getter = getattr(self.session, "get_provider_graph_assignment_info", None)
        if getter is not None and self.version >= ASSIGNMENT_INFO_SINCE:
            nodes: dict[str, list[PlacedNode]] = {}
            for subgraph in getter():
                bucket = nodes.setdefault(subgraph.ep_name, [])
                bucket.extend(PlacedNode(n.op_type, n.name, n.domain) for n in subgraph.get_nodes())
            return Placement(self.target.provider, {k: tuple(v) for k, v in nodes.items()}, "assignment-info")
        return self._placement_by_profiling()

    def _placement_by_profiling(self) -> Placement:
        """ORT < 1.24: profile one run in a throwaway session and read each node event's provider."""
        from onnxaccel.inputs import synthesize

        with tempfile.TemporaryDirectory() as tmp:
            so = self._session_options()
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(tmp, "placement")
            try:
                with ep_environment(self._ep.env):
                    session = self.ort.InferenceSession(str(self.model.path), so, providers=self._providers())
                session.run(None, synthesize(self.model))
                events = json.load(open(session.end_profiling()))
            except Exception:  # noqa: BLE001 - placement stays unknown rather than failing the run
                return Placement(self.target.provider)
        nodes: dict[str, dict[str, PlacedNode]] = {}
        for event in events:
            args = event.get("args", {})
            if event.get("cat") == "Node" and "provider" in args and event["name"].endswith("_kernel_time"):
                name = event["name"][: -len("_kernel_time")]
                nodes.setdefault(args["provider"], {})[name] = PlacedNode(args.get("op_name", "?"), name)
        return Placement(self.target.provider, {k: tuple(v.values()) for k, v in nodes.items()}, "profiling")

    # -- running ---------------------------------------------------------------------------------------

    @property
    def providers(self) -> list[str]:
        return list(self.session.get_providers())

    def effective_provider_options(self) -> dict[str, str]:
        """Every option of the requested provider with its effective value, as the runtime reports it."""
        return dict(self.session.get_provider_options().get(self.target.provider, {}))

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Host in, host out. Tensors of types numpy lacks (bfloat16, float8, int4: ml_dtypes arrays) travel
        as OrtValues built from their bits; sequences come back as lists, optionals as None or the value."""
        names = self._output_names
        raw = self._raw_io()
        try:
            if raw is None:  # the common case: plain numpy in and out, no per-run overhead
                values = self.session.run(names, dict(feeds))
            else:
                values = self._run_raw(feeds, *raw)
        except Exception as exc:  # noqa: BLE001
            raise _inference_error(self.target, exc) from exc
        return dict(zip(names, values))

    def _raw_io(self) -> tuple[frozenset, bool] | None:
        """(inputs, whether any output) of element types numpy has no dtype for; None when there are none."""
        if "_raw" not in self.__dict__:
            inputs = frozenset(s.name for s in self.model.inputs if _raw_elem(s.elem_type))
            outputs = any(_raw_elem(s.elem_type) for s in self.model.outputs)
            self._raw = (inputs, outputs) if inputs or outputs else None
        return self._raw

    def _run_raw(self, feeds: Mapping[str, np.ndarray], raw_inputs: frozenset, raw_outputs: bool) -> list:
        ort, names = self.ort, self._output_names
        values = {k: _raw_ortvalue(ort, v) if k in raw_inputs and isinstance(v, np.ndarray) else v
                  for k, v in feeds.items()}
        if not raw_outputs:
            return self.session.run(names, values)  # session.run takes OrtValues among the feeds
        values = {k: v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
                  for k, v in values.items()}
        return [_host_value(v) for v in self.session.run_with_ort_values(names, values)]

    def bind(self, feeds: Mapping[str, np.ndarray], *,
             fixed_outputs: Mapping[str, tuple[tuple[int, ...], np.dtype]] | None = None) -> OrtBoundRun:
        """IO binding for ``feeds``' shapes. ``fixed_outputs`` (shape and dtype by output name): outputs too are
        bound once, at addresses that never change, as a captured CUDA graph replays into them."""
        return OrtBoundRun(self, feeds, fixed_outputs=fixed_outputs)

    def close(self) -> None:
        self.session = None


class OrtBoundRun(BoundRun):
    """IO binding: inputs copied to the device once, outputs allocated there by ONNX Runtime.

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
        if not all(s.is_tensor and s.elem_type != onnx.TensorProto.STRING
                   for s in (*runner.model.inputs, *runner.model.outputs)):
            self._host_feeds = dict(feeds)
            return
        self.binding = runner.session.io_binding()
        self._raw_outputs = {s.name for s in runner.model.outputs if _raw_elem(s.elem_type)}
        for name, array in feeds.items():
            if _raw_elem(runner.model.input(name).elem_type):
                # Bound as a host OrtValue: ONNX Runtime copies it to the device for the run.
                self.values[name] = _raw_ortvalue(ort, array)
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

    def _bind_outputs_on_device(self) -> None:
        for name in self.output_names:
            if name in self._raw_outputs:
                self.binding.bind_output(name, "cpu")  # read back from their bits, on the host
            elif self.vendor is not None:
                self.binding.bind_output(name, self.device, self.device_id, vendor_id=self.vendor)
            else:
                self.binding.bind_output(name, self.device, self.device_id)

    def update(self, feeds: Mapping[str, np.ndarray]) -> None:
        if self._host_feeds is not None:
            self._host_feeds.update(feeds)
            return
        for name, array in feeds.items():
            if _raw_elem(self.runner.model.input(name).elem_type):
                self.values[name] = _raw_ortvalue(self.runner.ort, array)
                self.binding.bind_ortvalue_input(name, self.values[name])
            else:
                self.values[name].update_inplace(_c_order(array))

    def run(self) -> None:
        if self._host_feeds is not None:
            self._host_outputs = self.runner.run(self._host_feeds)
            return
        try:
            self.runner.session.run_with_iobinding(self.binding)
        except Exception as exc:  # noqa: BLE001
            raise _inference_error(self.runner.target, exc) from exc

    def outputs(self) -> dict[str, np.ndarray]:
        if self._host_feeds is not None:
            return dict(self._host_outputs)
        if not self._raw_outputs:
            return dict(zip(self.output_names, self.binding.copy_outputs_to_cpu()))
        return dict(zip(self.output_names, (_host_value(v) for v in self.binding.get_outputs())))

    def input_addresses(self) -> dict[str, int] | None:
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


def _raw_elem(elem_type: int) -> bool:
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


def _raw_ortvalue(ort, array):
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


def _host_value(value):
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


# -- errors ----------------------------------------------------------------------------------------------

def _check_provider_built(ort, target: Target, version: Version) -> None:
    available = ort.get_available_providers()
    if target.device == "rocm" and version >= ROCM_EP_REMOVED:
        raise TargetError(
            f"The ROCm execution provider was removed from ONNX Runtime in 1.23 (microsoft/onnxruntime#25181); "
            f"the installed onnxruntime is {version}.",
            "On AMD GPUs use --target migraphx with onnxruntime-migraphx (pip install 'onnxaccel[migraphx]'); "
            "the ROCm EP exists only in onnxruntime-rocm <= 1.22 (pip install 'onnxaccel[rocm]').",
        )
    if target.provider in available:
        return
    package, extra = PROVIDER_PACKAGE[target.device]
    installed = installed_distributions()
    have = ", ".join(f"{k} {v}" for k, v in installed.items()) or "none"
    hint = f"Install {package} instead: pip uninstall -y {' '.join(installed) or 'onnxruntime'} && " \
           f"pip install 'onnxaccel[{extra}]'."
    if len(installed) > 1:
        hint = (f"Several onnxruntime packages are installed ({have}); they overwrite one another's module. "
                f"Uninstall all of them, then pip install 'onnxaccel[{extra}]'.")
    raise ProviderUnavailableError(
        f"{target.provider} is not part of the installed ONNX Runtime ({have}; it has: {', '.join(available)}).",
        hint,
    )


def _provider_failed(target: Target, log: str, actual: list[str]) -> ProviderUnavailableError:
    found = diagnose(log)
    cause = found.cause if found else (first_error_line(log) or "no reason was logged")
    return ProviderUnavailableError(
        f"{target.provider} did not load ({cause}); ONNX Runtime would have run the model on "
        f"{', '.join(actual)} instead.",
        found.fix if found else "Run `onnxaccel doctor --target " + str(target) + "` for the full diagnosis.",
        details=log.strip() or None,
    )


def _session_error(target: Target, model: Model, exc: Exception, log: str) -> Exception:
    text = f"{exc}\n{log}"
    if "Unknown provider option" in text or "Invalid device ID" in text:
        found = diagnose(text)
        return ProviderOptionError(f"{target.provider}: {found.cause if found else exc}",
                                   found.fix if found else None, details=text.strip())
    # ONNX Runtime only guarantees opset >= 7 of ai.onnx (its warning "ONNX Runtime only *guarantees* support
    # for models stamped with opset version 7 or above", microsoft/onnxruntime onnxruntime/core/graph/model.cc,
    # Model::Model); 1.32.0 has no kernel for several opset-6 ops ("Could not find an implementation for
    # Gemm(6) node with name ''", seen on onnx's pytorch-converted test_Linear). The fix is a newer opset.
    if 0 < model.default_opset < 7:
        out = f"{model.path.stem}.opset13.onnx"
        return ModelVersionError(
            f"ONNX Runtime cannot run {model.source}: it uses opset {model.default_opset} of ai.onnx, older than "
            f"the opset 7 ONNX Runtime supports ({first_error_line(str(exc))})",
            f"Convert it to a newer opset: onnxaccel optimize {model.source} -o {out} --opset 13",
            details=text)
    if "IR version" in text or "opset" in text and "support" in text:
        return ModelVersionError(f"ONNX Runtime cannot read {model.source}: {first_error_line(str(exc))}",
                                 "Upgrade onnxruntime, or re-export the model for an older opset.", details=text)
    found = diagnose(text)
    if found:
        return ProviderUnavailableError(f"{target.provider} did not load: {found.cause}.", found.fix, details=text)
    return InferenceError(
        f"ONNX Runtime could not build a session for {model.source} on {target}: {first_error_line(str(exc))}",
        "Check the model with `onnxaccel inspect`; rerun with --debug for the full runtime message.",
        details=text,
    )


def _inference_error(target: Target, exc: Exception) -> InferenceError:
    found = diagnose(str(exc))
    return InferenceError(
        f"Inference failed on {target}: {first_error_line(str(exc))}",
        found.fix if found else "Check input shapes and dtypes (`onnxaccel inspect`); --debug shows the full error.",
        details=str(exc),
    )


# -- ONNX Runtime's own log -------------------------------------------------------------------------------
# ONNX Runtime writes its log lines ("[W:onnxruntime:...]", "[E:onnxruntime:...]", ANSI-coloured) to file
# descriptor 2, from two loggers: each session's (severity from SessionOptions.log_severity_level, fixed at
# creation and inherited by its runs) and the process-wide default logger (set_default_logger_severity; used
# while providers are created and by some kernels). Severities: 0 verbose, 1 info, 2 warning, 3 error,
# 4 fatal (microsoft/onnxruntime include/onnxruntime/core/common/logging/severity.h, 1.32).

#: How much of the runtime's log reaches stderr, by level: "quiet" (nothing: failures reach the user as our
#: own errors, with the runtime's text in their details), "verbose" (warnings and errors), "debug" (all).
RUNTIME_LOG_SEVERITY = {"quiet": 4, "verbose": 2, "debug": 0}
_runtime_log = {"level": "quiet", "explicit": False, "applied": None}
_capture_lock = threading.Lock()
_capture_depth = 0


def set_runtime_log_level(level: str) -> None:
    """Choose how much of ONNX Runtime's own log reaches stderr ("quiet", "verbose" or "debug"); the CLI calls
    this from --verbose/--debug. Sessions built afterwards use it, and so does the process-wide default logger
    (which is left alone until this is called)."""
    if level not in RUNTIME_LOG_SEVERITY:
        raise ValueError(f"runtime log level must be one of {', '.join(RUNTIME_LOG_SEVERITY)}, not {level!r}")
    _runtime_log.update(level=level, explicit=True)
    ort = sys.modules.get("onnxruntime")
    if ort is not None:
        _apply_default_logger(ort)


def runtime_log_level() -> str:
    return _runtime_log["level"]


def runtime_log_severity() -> int:
    """The ONNX Runtime severity for sessions: 4 (fatal only) unless --verbose (2) or --debug (0)."""
    return RUNTIME_LOG_SEVERITY[_runtime_log["level"]]


def _apply_default_logger(ort, severity: int | None = None) -> None:
    if not _runtime_log["explicit"]:
        return
    if severity is None and _capture_depth > 0:
        return  # a capture has opened the default logger to warnings: keep it so until the capture ends
    severity = runtime_log_severity() if severity is None else severity
    if _runtime_log["applied"] != severity and hasattr(ort, "set_default_logger_severity"):
        ort.set_default_logger_severity(severity)
        _runtime_log["applied"] = severity


class _Captured:
    def __init__(self):
        self.file = tempfile.TemporaryFile(mode="w+b")

    def text(self) -> str:
        self.file.seek(0)
        return self.file.read().decode(errors="replace")


@contextlib.contextmanager
def capture_native_stderr():
    """Capture what native code writes to file descriptor 2 (ONNX Runtime logs there).

    The text is kept for diagnosis (why a provider did not load), so while capturing, the default logger
    logs warnings even when the runtime log is quiet. The captured text is echoed to stderr afterwards only
    with --verbose or --debug."""
    global _capture_depth
    captured = _Captured()
    try:
        fd = os.dup(2)
    except OSError:  # no stderr at all
        yield captured
        return
    ort = sys.modules.get("onnxruntime")
    with _capture_lock:
        _capture_depth += 1
        if ort is not None and _capture_depth == 1:
            _apply_default_logger(ort, min(runtime_log_severity(), 2))
    try:
        sys.stderr.flush()
        os.dup2(captured.file.fileno(), 2)
        yield captured
    finally:
        os.dup2(fd, 2)
        os.close(fd)
        with _capture_lock:
            _capture_depth -= 1
            if ort is not None and _capture_depth == 0:
                _apply_default_logger(ort)
        if _runtime_log["level"] != "quiet":
            text = captured.text()
            if text:
                sys.stderr.write(text if text.endswith("\n") else text + "\n")
                sys.stderr.flush()


def _probe_model() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return model.SerializeToString()


@dataclass
class ProbeResult:
    loaded: bool
    #: ``get_providers()`` of the probe session, when one was built.
    providers: list[str]
    cause: str | None = None
    fix: str | None = None
    #: The runtime's exception text and log, verbatim.
    details: str | None = None

    def to_dict(self) -> dict:
        return {"loaded": self.loaded, "providers": self.providers, "cause": self.cause, "fix": self.fix,
                "details": self.details}


def probe(target: Target) -> ProbeResult:
    """Build a one-node session on the target and look whether its provider stayed first.

    ``get_available_providers()`` only says how the wheel was built: onnxruntime-migraphx lists MIGraphX on
    machines without ROCm, and the CUDA EP logs an error and silently runs on the CPU (rocm_facts.md §1.4,
    §7). Keeps the runtime's own words (``details``) and their translation (``cause``/``fix``).
    """
    ort = import_ort()
    if target.device in ("cuda", "tensorrt") and hasattr(ort, "preload_dlls"):
        # Loads CUDA/cuDNN from pip's nvidia-* wheels when present; prints, never raises (rocm_facts.md §7).
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
            ort.preload_dlls()
    try:
        ep = ep_options(target)
    except OnnxAccelError as exc:  # an option this build does not take: the target is not ready here
        return ProbeResult(False, [], exc.message, exc.hint)
    providers = [(target.provider, ep.options)]
    if target.provider != CPU:
        providers.append((CPU, {}))
    printed = io.StringIO()
    with capture_native_stderr() as log, contextlib.redirect_stdout(printed), ep_environment(ep.env), \
            warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            session = ort.InferenceSession(_probe_model(), providers=providers, enable_fallback=0)
        except Exception as exc:  # noqa: BLE001 - the runtime's failure is the finding
            text = "\n".join([str(exc), log.text(), *(str(w.message) for w in warned)]).strip()
            found = diagnose(text)
            return ProbeResult(False, [], found.cause if found else first_error_line(str(exc)),
                               found.fix if found else None, text)
    actual = list(session.get_providers())
    text = "\n".join([log.text(), printed.getvalue(), *(str(w.message) for w in warned)]).strip()
    if actual and actual[0] == target.provider:
        return ProbeResult(True, actual, details=text or None)
    found = diagnose(text)
    cause = found.cause if found else (first_error_line(text) or f"{target.provider} was dropped without a reason")
    return ProbeResult(False, actual, cause, found.fix if found else None, text or None)


def ep_options(target: Target, proto: onnx.ModelProto | None = None) -> EpOptions:
    """The provider options of a session on ``target``, as the installed build takes them (MIGraphX: its
    spelling, its keys, its environment-only settings; engines/ort_ep_options.py), with notes."""
    if target.device == "migraphx":
        return migraphx_options(target, installed_build(), proto)
    return EpOptions(target.provider_options())


def probe_provider(target: Target) -> str | None:
    """None when the target's provider really loads here, else the translated reason it does not."""
    result = probe(target)
    return None if result.loaded else result.cause
