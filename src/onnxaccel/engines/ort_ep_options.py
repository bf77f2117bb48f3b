"""The MIGraphX provider options of one session, spelled for the installed build, and honest about INT8.

``Target.provider_options()`` says what the user asked for, in onnxaccel's own spelling (booleans 1/0). This
module turns that into what the installed ONNX Runtime accepts (engines/ort_flavour.py): its boolean
spelling, only keys it declares, settings its provider reads only from ``ORT_MIGRAPHX_*`` variables moved
there. A key the build does not know is refused here with the reason, never left to fail inside ONNX Runtime
("Invalid MIGraphX EP option", "Unknown provider option"); the compiled-program cache, which changes only
start-up time, is dropped with a note instead.

INT8: the MIGraphX EP quantizes to INT8 only when ``(int8_enable xor fp8_enable) && int8_calibration_cache_
available`` (ROCm/onnxruntime rel-1.22.1 migraphx_execution_provider.cc L1291; ``int8_enable_ && ..._available_``
at microsoft v1.22.1 L1167), and every build read hands quantize_int8 a map that the table never fills. So a
float model under ``migraphx_int8_enable=1`` runs in FP32. ``migraphx/int8`` is therefore accepted only for a
model whose graph is already quantized (QDQ, from ``onnxaccel optimize --int8 static``), which MIGraphX runs
in INT8: its GPU target runs simplify_qdq (ROCm/AMDMIGraphX src/targets/gpu/target.cpp L129 @ f729a52), which
turns a convolution or dot between DequantizeLinear inputs into quant_convolution / quant_dot
(src/simplify_qdq.cpp L175, L227). Anything else is refused with the fix. NOT EXECUTED ON AMD HARDWARE.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import onnx

from onnxaccel import providers
from onnxaccel.engines.ort_flavour import ENV_OF, PARSERS, MigraphxParser, OrtBuild
from onnxaccel.errors import ProviderOptionError, TargetError
from onnxaccel.target import Target

#: Ops that carry quantized computation in a graph MIGraphX parses (QDQ pairs, QOperator and integer ops).
QUANTIZED_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger",
    "MatMulInteger", "QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool",
    "QLinearSigmoid", "QLinearLeakyRelu"})
#: Options whose absence changes start-up time only: dropped with a note on a build that lacks them.
DROPPABLE = {"migraphx_model_cache_dir": "the compiled program is not cached: every start compiles again"}
_TABLE_KEY = "migraphx_int8_calibration_table_name"
_SPEC = providers.get("migraphx")
_BOOL_KEYS = frozenset(k for k, kind in _SPEC.all_options().items() if kind == "bool")
_env_lock = threading.Lock()


@dataclass
class EpOptions:
    """Provider options as the build spells them, environment variables to set while the session is built,
    and notes for the user."""

    options: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def quantized_nodes(proto: onnx.ModelProto) -> Counter:
    """Quantization ops in the main graph, by type: what proves a graph runs in INT8 on MIGraphX."""
    return Counter(n.op_type for n in proto.graph.node if n.op_type in QUANTIZED_OPS)


def calibration_table_refusal(parser: MigraphxParser | None = None) -> ProviderOptionError:
    """Why the MIGraphX EP's calibration-table path is not offered, and what to do instead."""
    where = parser.title if parser else "any ONNX Runtime build read (v1.20-v1.22.1, AMD rel-1.22.1/rocm7.0, >= 1.23)"
    return ProviderOptionError(
        f"The MIGraphX EP's INT8 calibration table is not used by {where}: the provider reads the table into a "
        "local map and hands migraphx::quantize_int8 a member map that nothing fills (microsoft/onnxruntime "
        "v1.22.1 migraphx_execution_provider.cc L151/L1175; ROCm/onnxruntime rel-1.22.1 L162/L1445), so MIGraphX "
        "would calibrate on uninitialized values.",
        "Quantize the model instead: `onnxaccel optimize MODEL --int8 static --calibration DATA -o model.int8.onnx` "
        "writes a QDQ model that MIGraphX runs in INT8; run it with --target migraphx/int8. Or use the native "
        "engine, which calibrates with real data: --target 'migraphx/int8@migraphx?calibration=DATA'.")


def check_int8_source(target: Target, proto: onnx.ModelProto) -> Counter:
    """For migraphx/int8 through the EP: the graph's quantization ops, or a refusal saying how to get them."""
    if target.engine != "ort" or target.device != "migraphx" or target.precision != "int8":
        return Counter()
    if _TABLE_KEY in target.option_dict and not any(p.uses_calibration_table for p in PARSERS):
        raise calibration_table_refusal()
    found = quantized_nodes(proto)
    if not found and _TABLE_KEY not in target.option_dict:
        raise TargetError(
            f"{target} would not run INT8: this model has no quantized nodes, and the MIGraphX EP quantizes only "
            "with a calibration table (`(int8_enable xor fp8_enable) && int8_calibration_cache_available`, "
            "ROCm/onnxruntime rel-1.22.1 migraphx_execution_provider.cc L1291), so it would run FP32 under an "
            "INT8 label.",
            "Quantize it first: `onnxaccel optimize MODEL --int8 static --calibration DATA -o model.int8.onnx`, "
            "then run model.int8.onnx with --target migraphx/int8 (MIGraphX runs QDQ graphs in INT8). For FP16 "
            "without a conversion use --target migraphx/fp16.")
    return found


def migraphx_options(target: Target, build: OrtBuild, proto: onnx.ModelProto | None = None) -> EpOptions:
    """The options for ``target``'s MIGraphX EP on ``build`` (``proto``: the model; None for a probe)."""
    wanted = target.provider_options()
    parser = build.migraphx
    if parser is None:
        return EpOptions(wanted)
    notes: list[str] = []
    wanted = _int8(target, wanted, parser, proto, notes)
    out, env = {}, {}
    for key, value in wanted.items():
        if key in parser.env_only:
            env[parser.env_only[key]] = _env_value(key, value)
        elif key in build.migraphx_keys:
            out[key] = parser.spell(value == "1") if key in _BOOL_KEYS else value
        elif key in DROPPABLE:
            notes.append(f"{key} was not passed: {build.label} has no such MIGraphX option; {DROPPABLE[key]}.")
        else:
            raise _undeclared(key, build)
    notes += _overridden(out, env)
    return EpOptions(out, env, notes)


def _int8(target: Target, wanted: dict[str, str], parser: MigraphxParser, proto: onnx.ModelProto | None,
          notes: list[str]) -> dict[str, str]:
    if _TABLE_KEY in wanted:
        if not parser.uses_calibration_table:
            raise calibration_table_refusal(parser)
        return wanted
    if wanted.get("migraphx_fp8_enable") == "1":
        notes.append("migraphx_fp8_enable does nothing without a calibration table (the EP quantizes to FP8 only "
                     "with one); the model runs at the precision its graph has.")
    if proto is None:
        return wanted
    if target.precision == "int8":
        found = check_int8_source(target, proto)
    elif wanted.get("migraphx_int8_enable") == "1":
        found = quantized_nodes(proto)
    else:
        return wanted
    wanted = {k: v for k, v in wanted.items() if k != "migraphx_int8_enable"}
    if found:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(found.items()))
        notes.append(f"INT8 comes from the model's quantized graph ({ops}), which MIGraphX runs in INT8; "
                     "migraphx_int8_enable was not passed (it acts only with a calibration table).")
    else:
        notes.append("migraphx_int8_enable was not passed: without a calibration table the MIGraphX EP does no INT8, "
                     "and this model has no quantized nodes (it runs as FP32).")
    return wanted


def _env_value(key: str, value: str) -> str:
    """The providers read ORT_MIGRAPHX_* booleans with std::stoi: "1"/"0"."""
    return value if key not in _BOOL_KEYS else ("1" if value == "1" else "0")


def _undeclared(key: str, build: OrtBuild) -> ProviderOptionError:
    parser = build.migraphx
    assert parser is not None
    later = (" The key exists in microsoft/onnxruntime source after 1.27.1 (03c1250, migraphx_execution_provider_"
             "info.h L37-38) but not in this build." if key in _SPEC.newer_options else "")
    return ProviderOptionError(
        f"{build.label} does not declare the MIGraphX option '{key}' (read from {build.evidence}; it parses "
        f"options as {parser.title}), so ONNX Runtime would fail with '{parser.unknown_key_error}'.{later}",
        f"Drop -o {key}. Options this build takes: {', '.join(sorted(build.migraphx_keys))}.",
    )


def _overridden(options: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """ORT_MIGRAPHX_* variables already in the environment win over the options (every provider reads them
    after the session info): say so where one would change what was asked."""
    notes = []
    for key, value in options.items():
        var = ENV_OF.get(key)
        if var and var not in env and os.environ.get(var) not in (None, "", value):
            notes.append(f"{var}={os.environ[var]} is set in the environment and overrides {key}={value} "
                         "(the MIGraphX EP reads it after the provider options); unset it.")
    return notes


@contextlib.contextmanager
def ep_environment(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` while a session is built (the provider reads it in its constructor), then restore.

    Sessions are built in the threads that use them, so the change is serialized: two sessions built at
    once cannot see each other's settings."""
    if not env:
        yield
        return
    with _env_lock:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
