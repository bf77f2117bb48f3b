"""The ONNX Runtime engine: build a session for a target, verify where it really runs, run it.

ONNX Runtime's failure modes differ by provider (seen with onnxruntime-migraphx 1.27.1, onnxruntime 1.32.0 and onnxruntime-gpu 1.31.1 on a host without ROCm or CUDA): MIGraphX raises when its
libraries are missing, CUDA and ROCm log an error and silently run on the CPU. So after building the
session this engine checks ``get_providers()`` and the node placement, and turns a silent fallback into a
loud one.

The installed runtime (import, version, limits, its log, provider probes) is in engines/ort_runtime.py, IO
binding and raw-typed values in engines/ort_binding.py; their public names are importable from here too.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import time
from collections.abc import Mapping

import numpy as np
from packaging.version import Version

from onnxaccel.install import install_command, swap_command
from onnxaccel.engines.base import CPU, PlacedNode, Placement, Runner
from onnxaccel.engines.ort_binding import OrtBoundRun, host_value, inference_error, is_raw_elem, raw_ortvalue
from onnxaccel.engines.ort_ep_options import check_int8_source, ep_environment
from onnxaccel.engines.ort_errors import diagnose, first_error_line
from onnxaccel.engines.ort_runtime import (
    ORT_DISTRIBUTIONS,
    RUNTIME_LOG_SEVERITY,
    ProbeResult,
    _apply_default_logger,
    capture_native_stderr,
    ep_options,
    import_ort,
    installed_distributions,
    ort_version,
    probe,
    probe_provider,
    runtime_limits,
    runtime_log_level,
    runtime_log_severity,
    set_runtime_log_level,
)
from onnxaccel.errors import (
    InferenceError,
    ModelVersionError,
    PlacementError,
    ProviderOptionError,
    ProviderUnavailableError,
    TargetError,
)
from onnxaccel.inputs import synthesize
from onnxaccel.model import Model
from onnxaccel.target import PROVIDER_PACKAGE, Target

#: Importable from here for the rest of the code (defined in ort_runtime.py and ort_binding.py).
__all__ = [
    "ASSIGNMENT_INFO_SINCE", "ORT_DISTRIBUTIONS", "ROCM_EP_REMOVED", "RUNTIME_LOG_SEVERITY", "OrtBoundRun",
    "OrtEngine", "OrtRunner", "ProbeResult", "capture_native_stderr", "ep_options", "import_ort",
    "installed_distributions", "ort_version", "probe", "probe_provider", "runtime_limits", "runtime_log_level",
    "runtime_log_severity", "set_runtime_log_level",
]

#: ORT version that deleted the ROCm EP (microsoft/onnxruntime#25181).
ROCM_EP_REMOVED = Version("1.23")
#: ORT version that added get_provider_graph_assignment_info (microsoft/onnxruntime#26781).
ASSIGNMENT_INFO_SINCE = Version("1.24")

_GRAPH_OPT = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
              "layout": "ORT_ENABLE_LAYOUT", "all": "ORT_ENABLE_ALL"}


class OrtEngine:
    """Compiles a Model for a Target into an :class:`OrtRunner`."""

    name = "ort"

    def compile(self, model: Model, target: Target, *, strict: bool = False) -> OrtRunner:
        """Check the target can run here and the model in this runtime (IR, opset), bind it, build the runner."""
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

    def probe(self, target: Target) -> ProbeResult:
        """A one-node session on ``target``: does its provider stay first (:func:`probe`)?"""
        return probe(target)


class OrtRunner(Runner):
    """A model in an ONNX Runtime session on its target's provider, with the provider checked to be the one
    that runs it (no silent CPU fallback) and its node placement read."""

    def __init__(self, model: Model, target: Target, *, strict: bool = False):
        self.ort = import_ort()
        self.model = model
        #: RunOptions of every run (None: the session's defaults); see shrink_arenas.
        self._run_options = None
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
        # Read once: get_outputs() builds new objects on every call.
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
        """The session's providers, in priority order."""
        return list(self.session.get_providers())

    def effective_provider_options(self) -> dict[str, str]:
        """Every option of the requested provider with its effective value, as the runtime reports it."""
        return dict(self.session.get_provider_options().get(self.target.provider, {}))

    def _run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Host in, host out (the feeds checked by ``Runner.run``). Tensors of types numpy lacks (bfloat16,
        float8, int4: ml_dtypes arrays) travel as OrtValues built from their bits; sequences come back as lists,
        optionals as None or the value. A failure is an InferenceError in the runtime's words; ONNX Runtime
        checks every feed itself before it computes (fixed dims included), and the template words such a
        refusal with the feed check."""
        names = self._output_names
        raw = self._raw_io()
        try:
            if raw is None:  # the common case: plain numpy in and out, no per-run overhead
                values = self.session.run(names, dict(feeds), self._run_options)
            else:
                values = self._run_raw(feeds, *raw)
        except Exception as exc:  # noqa: BLE001
            raise inference_error(self.target, exc) from exc
        return dict(zip(names, values))

    def shrink_arenas(self) -> bool:
        """Run with RunOptions that shrink the memory arenas after each run, where an arena is on.

        Key and value format from onnxruntime include/onnxruntime/core/session/onnxruntime_run_options_config_keys.h
        (kOrtRunOptionsConfigEnableMemoryArenaShrinkage): "cpu:0;gpu:0"; "cpu" only while the CPU arena is on.
        """
        devices = []
        if self.target.option_dict.get("enable_cpu_mem_arena", "1") != "0":
            devices.append("cpu:0")
        if self.target.is_gpu:
            devices.append(f"gpu:{self.target.device_id or 0}")
        if not devices:
            return False
        options = self.ort.RunOptions()
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", ";".join(devices))
        self._run_options = options
        return True

    def _raw_io(self) -> tuple[frozenset, bool] | None:
        """(inputs, whether any output) of element types numpy has no dtype for; None when there are none."""
        if "_raw" not in self.__dict__:
            inputs = frozenset(s.name for s in self.model.inputs if is_raw_elem(s.elem_type))
            outputs = any(is_raw_elem(s.elem_type) for s in self.model.outputs)
            self._raw = (inputs, outputs) if inputs or outputs else None
        return self._raw

    def _run_raw(self, feeds: Mapping[str, np.ndarray], raw_inputs: frozenset, raw_outputs: bool) -> list:
        ort, names = self.ort, self._output_names
        values = {k: raw_ortvalue(ort, v) if k in raw_inputs and isinstance(v, np.ndarray) else v
                  for k, v in feeds.items()}
        if not raw_outputs:
            return self.session.run(names, values, self._run_options)  # session.run takes OrtValues among the feeds
        values = {k: v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
                  for k, v in values.items()}
        return [host_value(v) for v in self.session.run_with_ort_values(names, values)]

    def _bind(self, feeds: Mapping[str, np.ndarray], *,
              fixed_outputs: Mapping[str, tuple[tuple[int, ...], np.dtype]] | None = None) -> OrtBoundRun:
        """IO binding for ``feeds``' shapes (``Runner.bind`` checked them). ``fixed_outputs`` (shape and dtype by
        output name): outputs too are bound once, at addresses that never change, as a captured CUDA graph
        replays into them."""
        return OrtBoundRun(self, feeds, fixed_outputs=fixed_outputs)

    def close(self) -> None:
        """Drop the session (its memory goes with the last reference)."""
        self.session = None


# -- errors ----------------------------------------------------------------------------------------------

def _check_provider_built(ort, target: Target, version: Version) -> None:
    available = ort.get_available_providers()
    if target.device == "rocm" and version >= ROCM_EP_REMOVED:
        raise TargetError(
            f"The ROCm execution provider was removed from ONNX Runtime in 1.23 (microsoft/onnxruntime#25181); "
            f"the installed onnxruntime is {version}.",
            f"On AMD GPUs use --target migraphx with onnxruntime-migraphx ({install_command('migraphx')}); "
            f"the ROCm EP exists only in onnxruntime-rocm <= 1.22 ({install_command('rocm')}).",
        )
    if target.provider in available:
        return
    package, extra = PROVIDER_PACKAGE[target.device]
    installed = installed_distributions()
    have = ", ".join(f"{k} {v}" for k, v in installed.items()) or "none"
    hint = f"Install {package} instead: {swap_command(list(installed), extra)}."
    if len(installed) > 1:
        hint = (f"Several onnxruntime packages are installed ({have}); they overwrite one another's module. "
                f"Uninstall all of them, then {install_command(extra)}.")
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

