"""Graph optimization saved offline by ONNX Runtime, and transformer fusions.

ONNX Runtime's levels (https://onnxruntime.ai/docs/performance/model-optimizations/graph-optimizations.html):
*basic* rewrites are semantics-preserving and run before graph partitioning, so they apply to every execution
provider; *extended* fusions run after partitioning and only for nodes assigned to the CPU or CUDA providers
(they introduce com.microsoft contrib ops); *layout* (part of *all*) applies only to CPU nodes and picks NCHWc
blocking for the CPU it runs on. An offline-optimized model is therefore only valid for the provider (and,
at *all*, the CPU) it was optimized with; and a session that holds compiled nodes (MIGraphX, TensorRT) cannot
be saved ("Unable to serialize model as it contains compiled nodes"). So: CPU may use any level; CUDA uses
extended when its provider loads here; every other case is capped to basic, with a note.

Transformer fusions (Attention, SkipLayerNormalization, Gelu/BiasGelu/FastGelu, EmbedLayerNormalization) come
from ``onnxruntime.transformers.optimizer.optimize_model`` with ``opt_level=0`` (the Python fusions only; the
runtime's own optimization is the step above). MIGraphX parses the fused ops (AMDMIGraphX src/onnx:
parse_attention.cpp, parse_biasgelu.cpp, parse_fastgelu.cpp, parse_layernorm.cpp), TensorRT/CUDA run them
as ORT contrib kernels.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from onnxaccel import providers
from onnxaccel.engines.ort import capture_native_stderr, import_ort, probe_provider, runtime_log_severity
from onnxaccel.errors import MissingDependencyError, ModelError, UsageError
from onnxaccel.target import Target

#: ONNX Runtime's name for the CPU provider (from the registry: only providers/ and engines/ spell it).
_CPU = providers.get("cpu").provider

LEVELS = ("none", "basic", "extended", "all")
_ORT_LEVEL = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


@dataclass
class GraphStep:
    """What graph optimization did: the level used (after capping), the provider, fusions, notes."""

    requested: str
    level: str
    provider: str | None
    fusions: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The step as JSON-ready values."""
        return {"requested": self.requested, "level": self.level, "provider": self.provider,
                "fusions": self.fusions, "notes": self.notes}


def choose_level(requested: str, target: Target) -> tuple[str, str, list[str]]:
    """(level, provider, notes) for ``requested`` (``auto`` or one of LEVELS) on ``target``."""
    if requested not in LEVELS + ("auto",):
        raise UsageError(f"Unknown graph optimization level '{requested}'.",
                         f"Use one of: auto, {', '.join(LEVELS)}.")
    notes: list[str] = []
    if target.device == "cpu":
        # auto = extended: portable across CPUs, unlike 'all' whose NCHWc layout is tied to this CPU.
        return ("extended" if requested == "auto" else requested), _CPU, notes
    if requested == "none":
        return "none", None, notes
    if target.device == "cuda" and target.engine == "ort" and _loads(target):
        level = "extended" if requested in ("auto", "all") else requested
        if requested == "all":
            notes.append("level 'all' adds CPU-only layout rewrites; used 'extended' for the CUDA provider.")
        return level, target.provider, notes
    if requested in ("extended", "all"):
        why = ("compiling providers optimize the graph themselves and cannot be saved with compiled nodes"
               if target.device in ("migraphx", "tensorrt") else f"{target.provider} does not load here")
        notes.append(f"graph level capped to 'basic' for {target}: {why}; basic rewrites are valid for every "
                     "provider, extended/all are provider-specific.")
    return "basic", _CPU, notes


#: The name prefix of the Casts ONNX Runtime's InsertCastTransformer adds (microsoft/onnxruntime
#: onnxruntime/core/optimizer/insert_cast_transformer.cc, ``InsertedPrecisionFreeCast_``).
_INSERTED_CAST = "InsertedPrecisionFreeCast_"


class UnreloadableGraphError(ModelError):
    """ONNX Runtime saved an optimized graph that it cannot load again (see ort_optimize's ``reloadable``)."""


def ort_optimize(proto: onnx.ModelProto, level: str, provider: str, *, reloadable: bool = False) -> onnx.ModelProto:
    """Run ONNX Runtime's graph optimizations at ``level`` with ``provider`` and return the saved graph.

    ``reloadable``: also load the saved graph in a new session (default options, as a user loads it) and raise
    UnreloadableGraphError where that fails. ORT's saved graph holds what its partitioning added, not only its
    optimizations: on the CPU, the Casts its InsertCastTransformer puts around FP16 nodes the CPU has no kernel
    for, which ORT 1.32 then refuses to load ("Type Error: Type (tensor(float16)) of output arg
    (InsertedPrecisionFreeCast_a_scale) ... does not match expected type (tensor(float))" on ONNX's
    test_qlinearmatmul_3D_int8_float16 and test_flexattention_fp16_expanded_ver26, both of which plain ORT runs)."""
    ort = import_ort()
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _ORT_LEVEL[level])
    so.log_severity_level = runtime_log_severity()  # quiet unless --verbose/--debug, as every session
    large = proto.ByteSize() > 1_800_000_000
    with tempfile.TemporaryDirectory(prefix="onnxaccel-graph-") as tmp:
        source = Path(tmp) / "in.onnx"
        out = Path(tmp) / "out.onnx"
        onnx.save_model(proto, str(source), save_as_external_data=large)
        so.optimized_model_filepath = str(out)
        if large:
            # session config key from onnxruntime_session_options_config_keys.h
            so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "out.onnx.data")
        chain = [provider] + ([_CPU] if provider != _CPU else [])
        try:
            with capture_native_stderr():  # echoed only with --verbose/--debug
                ort.InferenceSession(str(source), so, providers=chain)
        except Exception as exc:  # noqa: BLE001
            first = str(exc).strip().splitlines()[0]
            raise ModelError(f"ONNX Runtime could not optimize the graph at level '{level}': {first}",
                             "Try --graph-level basic or none.", details=str(exc)) from exc
        result = conform_inputs(proto, onnx.load(str(out)))
        inserted = [n.name for n in result.graph.node if n.op_type == "Cast" and n.name.startswith(_INSERTED_CAST)]
        if reloadable and inserted:
            raise UnreloadableGraphError(
                f"ONNX Runtime's graph optimized at level '{level}' holds {len(inserted)} Cast(s) its {provider} "
                f"partitioning inserted around FP16 nodes it has no FP16 kernel for ({', '.join(inserted[:3])}"
                f"{', ...' if len(inserted) > 3 else ''}); they belong to one session (ONNX Runtime inserts them at "
                "each load): written into the model they would pin those nodes to float32 on every provider, and "
                "converted to FP16 ONNX Runtime refuses to load them",
                "Use --graph-level none.")
        if reloadable:
            again = ort.SessionOptions()
            again.log_severity_level = runtime_log_severity()
            try:
                with capture_native_stderr():
                    ort.InferenceSession(str(out) if large else result.SerializeToString(), again, providers=chain)
            except Exception as exc:  # noqa: BLE001
                first = str(exc).strip().splitlines()[0]
                raise UnreloadableGraphError(
                    f"ONNX Runtime's graph optimized at level '{level}' cannot be loaded again: {first}",
                    "Use --graph-level none.", details=str(exc)) from exc
        return result


def conform_inputs(source: onnx.ModelProto, optimized: onnx.ModelProto) -> onnx.ModelProto:
    """Give ONNX Runtime's saved graph of an IR < 4 model the inputs that IR version requires (in place).

    Before IR 4 every initializer must also be a graph input (onnx/onnx docs/IR.md, "Names Within a Graph";
    the checker: "X in initializer but not in graph input"), and such inputs are overridable defaults. ONNX
    Runtime's saved graph keeps the IR version but not that rule: the initializers it creates (constant
    folding, Conv+BN fusion, NCHWc reorders) are not added to the inputs, and the inputs whose initializers it
    folded away stay as inputs with no value, which a session then requires ("Required inputs ... are missing
    from input feed"). So drop those (unused, and not an input of ``source`` without an initializer) and add
    every initializer to the inputs; IR 4 and later models are returned unchanged.
    """
    if optimized.ir_version >= 4:
        return optimized
    graph = optimized.graph
    initializers = {t.name: t for t in graph.initializer}
    fed = {i.name for i in source.graph.input} - {t.name for t in source.graph.initializer}
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    keep = [i for i in graph.input if i.name in initializers or i.name in fed or i.name in used]
    listed = {i.name for i in keep}
    keep += [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
             for name, t in initializers.items() if name not in listed]
    del graph.input[:]
    graph.input.extend(keep)
    return optimized


def is_transformer(proto: onnx.ModelProto) -> bool:
    """Attention-shaped: Softmax, several MatMuls, and a LayerNorm (fused or as ReduceMean/Pow/Sqrt)."""
    ops = Counter(n.op_type for n in proto.graph.node)
    layer_norm = ops["LayerNormalization"] or ops["SkipLayerNormalization"] or (
        ops["ReduceMean"] >= 2 and (ops["Sqrt"] or ops["Pow"]))
    return bool(ops["Softmax"] or ops["Attention"]) and ops["MatMul"] >= 4 and bool(layer_norm)


def transformer_fusions(proto: onnx.ModelProto, *, model_type: str = "bert", use_gpu: bool = False
                        ) -> tuple[onnx.ModelProto, dict[str, int]]:
    """Fuse attention, LayerNorm and GELU patterns; return the model and the fused-op counts (non-zero)."""
    try:
        from onnxruntime.transformers import optimizer
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "cpu", "Transformer fusions") from exc
    quiet = logging.getLogger("onnxruntime.transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            optimized = optimizer.optimize_model(proto, model_type=model_type, num_heads=0, hidden_size=0,
                                                 opt_level=0, use_gpu=use_gpu)
    except Exception as exc:  # noqa: BLE001 - the fusion scripts raise plain exceptions on odd graphs
        raise ModelError(f"Transformer fusions failed: {type(exc).__name__}: {exc}",
                         "Run with --no-transformer-fusions.", details=repr(exc)) from exc
    finally:
        quiet.setLevel(level)
    stats = optimized.get_fused_operator_statistics() if hasattr(optimized, "get_fused_operator_statistics") else {}
    return optimized.model, {k: v for k, v in stats.items() if v}


def _loads(target: Target) -> bool:
    try:
        return probe_provider(target) is None
    except Exception:  # noqa: BLE001 - a provider that cannot even be probed does not load
        return False
