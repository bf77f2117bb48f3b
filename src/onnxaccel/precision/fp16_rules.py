"""Which nodes must stay FP32: by the ONNX schema, and by the kernels of the provider that will run them.

* Schema: ``onnx.defs.get_schema(op, opset, domain)`` lists each input/output's type parameter and the
  types it allows (``type_constraints``). A float tensor whose parameter allows ``tensor(float)`` but not
  ``tensor(float16)`` cannot become FP16 without making the graph invalid: TfIdfVectorizer's output (T1),
  LayerNormalization's Mean/InvStdDev (U, "float or bfloat16"; onnx/onnx docs/Operators.md,
  LayerNormalization-17), most ai.onnx.ml ops. Only tensors the node really has (non-empty names) count, so
  a LayerNormalization that declares only Y is converted.
* Provider: ONNX Runtime refuses a session when a node has no kernel for its types, with "Could not find an
  implementation for OP(VERSION) node with name '...'" (status NOT_IMPLEMENTED; microsoft/onnxruntime
  onnxruntime/core/session/inference_session.cc, VerifyEachNodeIsAssignedToAnEp) or, with graph
  optimizations off, "Failed to find kernel for OP(VERSION) (node:'...' ep:'...')" (both seen with
  onnxruntime 1.32.0). The caller blocks that op type and converts again; an op that still fails in FP32
  (e.g. Gemm(6) of an opset-6 model: "Version mismatch") is not an FP16 matter and is unblocked.
* Contrib ops (``com.microsoft``: QLinearAdd, QLinearMul, DynamicQuantizeMatMul... of a model ONNX Runtime's
  quantizer already made) have no schema in ``onnx.defs``; ONNX Runtime registers theirs
  (``onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema``), and the same rule applies: their
  scales are ``tensor(float)`` only, so an FP16 scale makes ONNX Runtime refuse the model ("Type
  'tensor(float16)' of input parameter (..._scale) of operator (QLinearAdd) ... is invalid").
* Kernel limits a session cannot show: a kernel registered for float16 that refuses it at run time for some
  attribute values (:data:`RUNTIME_FP16_LIMITS`, e.g. ScatterND with reduction='add' on the CPU).
"""

from __future__ import annotations

import functools
import re
import tempfile
from typing import NamedTuple
from pathlib import Path

import onnx

from onnxaccel import providers
from onnxaccel.engines.ort import import_ort

#: ONNX Runtime's name for the CPU provider (from the registry: only providers/ and engines/ spell it).
_CPU = providers.get("cpu").provider

_FLOAT = "tensor(float)"
_HALF = "tensor(float16)"
_MISSING_KERNEL = re.compile(r"(?:Could not find an implementation|Failed to find kernel) for (\w+)\((\d+)\)")


#: (provider, op type, attribute, values) whose float16 kernel fails at run time ("ORT_NOT_IMPLEMENTED" inside
#: Compute, so building the session succeeds). microsoft/onnxruntime commit 178ba40cdff6cdf187e4ab8343171aacd2fc01dc:
#: onnxruntime/core/providers/cpu/tensor/scatter.cc, Func_Add<MLFloat16> / Func_Mul<MLFloat16> ("CPU execution
#: provider: MLFloat16 data type is not supported with ScatterElements opset 16 when reduction is 'add'."; min
#: and max have float16 there; the message as onnxruntime 1.32.0 raises it), and scatter_nd.cc,
#: Func_{Add,Mul,Min,Max}_ND<MLFloat16> (the same text for ScatterND, 'add' and 'mul' since opset 16, 'min' and
#: 'max' since opset 18). Held by tests/transform/test_fp16_rules.py against the vendored scatter_nd.cc lines
#: (tests/transform/upstream/ort_scatter_nd_fp16.txt) and against the installed ONNX Runtime.
RUNTIME_FP16_LIMITS: tuple[tuple[str, str, str, frozenset[str]], ...] = (
    (_CPU, "ScatterElements", "reduction", frozenset({"add", "mul"})),
    (_CPU, "ScatterND", "reduction", frozenset({"add", "mul", "min", "max"})),
)


def runtime_limit_blocks(proto: onnx.ModelProto, provider: str | None) -> dict[str, str]:
    """{node name: reason} for main-graph nodes whose ``provider`` kernel refuses float16 for their attributes."""
    if provider is None:
        return {}
    blocks = {}
    for node in proto.graph.node:
        for limit_provider, op, attribute, values in RUNTIME_FP16_LIMITS:
            if limit_provider != provider or node.op_type != op or node.domain not in ("", "ai.onnx"):
                continue
            value = next((a.s.decode() for a in node.attribute if a.name == attribute), "none")
            if value in values:
                blocks[node.name] = (f"{provider} has no float16 {op} with {attribute}='{value}' (ONNX Runtime "
                                     f"refuses it at run time: \"MLFloat16 data type is not supported with {op}\")")
    return blocks


class _Schema(NamedTuple):
    """What :func:`schema_blocks` reads of an operator schema, from onnx.defs or from ONNX Runtime's registry."""
    since_version: int
    inputs: tuple[tuple[str, str], ...]  # (formal name, type string)
    outputs: tuple[tuple[str, str], ...]
    allowed: dict[str, set[str]]  # type parameter -> allowed type strings


def schema_blocks(proto: onnx.ModelProto) -> dict[str, str]:
    """{node name: reason} for main-graph nodes with a float input/output that the schema cannot type FP16
    (ONNX's schemas, and ONNX Runtime's for its contrib ops)."""
    try:
        from onnxruntime.transformers.float16 import ALWAYS_FLOAT_INPUTS
    except ImportError:  # the caller reports the missing converter
        ALWAYS_FLOAT_INPUTS = {}
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    types = _known_types(proto)
    blocks = {}
    for node in proto.graph.node:
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain not in opsets:
            continue
        schema = _schema(node.op_type, opsets[domain], domain)
        if schema is None:
            continue  # a custom op: the converter decides
        skip = set(ALWAYS_FLOAT_INPUTS.get(node.op_type, ()))
        for kind, names, formals in (("input", node.input, schema.inputs), ("output", node.output, schema.outputs)):
            for index, name in enumerate(names):
                if not name or not formals or (kind == "input" and index in skip):
                    continue
                formal, type_str = formals[min(index, len(formals) - 1)]
                options = schema.allowed.get(type_str, {type_str})
                if _FLOAT not in options or _HALF in options:
                    continue
                if types.get(name, onnx.TensorProto.FLOAT) != onnx.TensorProto.FLOAT:
                    continue  # this tensor is not float here (e.g. an int input of a mixed constraint)
                where = f"{node.domain}." if domain else ""
                blocks[node.name] = (
                    f"the {'ONNX' if not domain else 'ONNX Runtime contrib'} schema ({where}{node.op_type}-"
                    f"{schema.since_version}) allows no float16 for its {kind} {formal} ({type_str}: "
                    f"{', '.join(sorted(options))})")
                break
            if node.name in blocks:
                break
    return blocks


def _schema(op: str, version: int, domain: str) -> _Schema | None:
    """The schema of ``op`` at opset ``version`` of ``domain``: ONNX's, else ONNX Runtime's, else None."""
    try:
        found = onnx.defs.get_schema(op, version, domain)
    except Exception:  # noqa: BLE001 - SchemaError: not an ONNX op
        return _ort_schemas().get((domain, op), {}).get(_latest(_ort_schemas().get((domain, op), {}), version))
    return _Schema(found.since_version, tuple((f.name, f.type_str) for f in found.inputs),
                   tuple((f.name, f.type_str) for f in found.outputs),
                   {c.type_param_str: set(c.allowed_type_strs) for c in found.type_constraints})


def _latest(versions: dict[int, _Schema], opset: int) -> int | None:
    """The newest since_version at or below ``opset``."""
    return max((v for v in versions if v <= opset), default=None)


@functools.lru_cache(maxsize=1)
def _ort_schemas() -> dict[tuple[str, str], dict[int, _Schema]]:
    """ONNX Runtime's registered schemas of non-ONNX domains (com.microsoft...), by (domain, op) and version."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        registered = state.get_all_operator_schema()
    except Exception:  # noqa: BLE001 - an ONNX Runtime build without the registry: contrib ops stay unknown
        return {}
    out: dict[tuple[str, str], dict[int, _Schema]] = {}
    for schema in registered:
        if schema.domain in ("", "ai.onnx", "ai.onnx.ml"):
            continue
        out.setdefault((schema.domain, schema.name), {})[schema.since_version] = _Schema(
            schema.since_version, tuple((f.name, f.typeStr) for f in schema.inputs),
            tuple((f.name, f.typeStr) for f in schema.outputs),
            {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints})
    return out


def provider_missing_kernel(proto: onnx.ModelProto, provider: str) -> tuple[str, int] | None:
    """(op type, version) of the first node ``provider`` has no kernel for in ``proto``, else None.

    None too when the provider is not available here or the session fails for another reason
    (:func:`session_refusal` gives that reason).
    """
    return missing_kernel(session_refusal(proto, provider))


def missing_kernel(refusal: str | None) -> tuple[str, int] | None:
    """(op type, version) when ONNX Runtime's session error ``refusal`` says a kernel is missing, else None."""
    found = _MISSING_KERNEL.search(refusal or "")
    return (found.group(1), int(found.group(2))) if found else None


def session_refusal(proto: onnx.ModelProto, provider: str) -> str | None:
    """ONNX Runtime's message when a session of ``proto`` on ``provider`` cannot be built, else None (also when
    the provider is not available here: nothing can be said)."""
    ort = import_ort()
    if provider not in ort.get_available_providers():
        return None
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with tempfile.TemporaryDirectory(prefix="onnxaccel-fp16-probe-") as tmp:
        path = Path(tmp) / "probe.onnx"
        onnx.save_model(proto, str(path), save_as_external_data=proto.ByteSize() > 1_800_000_000)
        try:
            ort.InferenceSession(str(path), so, providers=[provider])
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            return str(exc).strip() or type(exc).__name__
    return None


def _known_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element types of the main graph's tensors, as far as ONNX type inference knows them."""
    try:
        graph = onnx.shape_inference.infer_shapes(proto).graph if proto.ByteSize() < 1_800_000_000 else proto.graph
    except Exception:  # noqa: BLE001 - unknown types count as float (the safe side: keep the node FP32)
        graph = proto.graph
    types = {t.name: t.data_type for t in graph.initializer}
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    return types
