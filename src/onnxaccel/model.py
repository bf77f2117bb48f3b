"""Model: load and validate an ONNX model, read its signature, bind symbolic dimensions.

Weights are never loaded here (``load_external_data=False``): the signature needs only the graph, and the
runtime reads the weights from the file itself. A model that must be rewritten for the runtime (see
:meth:`Model.for_runtime`) is written once into the cache and loaded from there.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from onnxaccel import model_memo, startup, zoo
from onnxaccel.model_data import check_tensor_data
from onnxaccel.errors import (
    ModelFormatError,
    ModelNotFoundError,
    ModelVersionError,
    ShapeError,
)
from onnxaccel.model_shapes import bind_shapes
from onnxaccel.paths import runtime_models_dir

ZOO_PREFIX = "zoo:"

Dim = int | str | None

# Tensor element types and the first ONNX IR version that allows them (onnx/onnx.proto3, "IR VERSION"
# comments: IR 9 added the float8 types, IR 10 uint4/int4, IR 11 float4e2m1, IR 12 float8e8m0,
# IR 13 uint2/int2). Used to decide whether lowering a model's IR version is safe.
_TYPE_MIN_IR = {
    "FLOAT8E4M3FN": 9, "FLOAT8E4M3FNUZ": 9, "FLOAT8E5M2": 9, "FLOAT8E5M2FNUZ": 9,
    "UINT4": 10, "INT4": 10, "FLOAT4E2M1": 11, "FLOAT8E8M0": 12, "UINT2": 13, "INT2": 13,
}


@dataclass(frozen=True)
class TensorSpec:
    """Name, value kind, element type and shape of a graph input or output.

    ``kind`` is the ONNX value kind: ``tensor``, ``sequence``, ``optional``, ``map`` or ``sparse_tensor``.
    ``dtype`` is the numpy name of the (innermost) tensor element type (``object`` for strings, ml_dtypes
    names such as ``bfloat16``/``float8_e4m3fn``/``int4`` for the types numpy lacks); ``elem_type`` its ONNX
    ``TensorProto.DataType``. ``shape`` (tensors only) holds an int for a fixed dim, the dim_param string for
    a symbolic one, None when unknown; it is None for the other kinds. ``type_proto`` is the graph's type.
    """

    name: str
    dtype: str
    shape: tuple[Dim, ...] | None
    kind: str = "tensor"
    elem_type: int = 0
    type_proto: onnx.TypeProto | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def is_tensor(self) -> bool:
        """True for a tensor (not a sequence, map or optional)."""
        return self.kind == "tensor"

    @property
    def is_static(self) -> bool:
        """True when every dimension is a known integer."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def np_dtype(self) -> np.dtype:
        """The numpy dtype of the element type (ml_dtypes types included; object for strings)."""
        if self.elem_type:
            try:
                return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type))
            except (KeyError, TypeError, ValueError):
                pass
        return np.dtype(self.dtype)

    @property
    def type_text(self) -> str:
        """ONNX Runtime's spelling of the type: tensor(float), seq(tensor(int64)), optional(seq(...))."""
        return _type_text(self.type_proto) if self.type_proto is not None else f"tensor({self.dtype})"

    def shape_text(self) -> str:
        """The shape as text, symbolic dimensions by name (the type for non-tensors)."""
        if not self.is_tensor:
            return self.type_text
        if self.shape is None:
            return "?"
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"

    def to_dict(self) -> dict:
        """JSON-ready form of the spec."""
        out = {"name": self.name, "dtype": self.dtype,
               "shape": list(self.shape) if self.shape is not None else None}
        if not self.is_tensor:
            out.update(kind=self.kind, type=self.type_text)
        return out


@dataclass(frozen=True)
class Model:
    """An ONNX model, its signature, and the shapes its symbolic dims are bound to for this run."""

    source: str
    path: Path
    proto: onnx.ModelProto = field(repr=False)
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    #: dim_param name -> value, and per-input concrete shapes, once bound.
    dim_values: Mapping[str, int] = field(default_factory=dict)
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: Set by bind(): inputs without a shape to bind (sequences, optionals, maps, and tensors whose graph
    #: gives no shape and no binding was given) have no entry in input_shapes; their shape comes from data.
    bound: bool = field(default=False, repr=False)

    @property
    def name(self) -> str:
        """Short name: the zoo name, or the file name without its suffix."""
        return self.source[len(ZOO_PREFIX):] if self.source.startswith(ZOO_PREFIX) else self.path.stem

    @property
    def ir_version(self) -> int:
        """The model's ONNX IR version."""
        return self.proto.ir_version

    @property
    def opsets(self) -> dict[str, int]:
        """Opset version per domain (the default domain as ``ai.onnx``)."""
        return {(o.domain or "ai.onnx"): o.version for o in self.proto.opset_import}

    @property
    def default_opset(self) -> int:
        """The default-domain opset version (0 when the model imports none)."""
        return self.opsets.get("ai.onnx", 0)

    @property
    def metadata(self) -> dict[str, str]:
        """The model's metadata properties as a dict."""
        return {p.key: p.value for p in self.proto.metadata_props}

    @property
    def is_bound(self) -> bool:
        """True when every input has a concrete shape (bound or static)."""
        return self.bound or len(self.input_shapes) == len(self.inputs)

    def input(self, name: str) -> TensorSpec:
        """The spec of the input named ``name``; a ShapeError listing the inputs when there is none."""
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise ShapeError(
            f"The model has no input named '{name}'.",
            f"Its inputs are: {', '.join(s.name for s in self.inputs)}.",
        )

    def bind(
        self,
        shapes: Mapping[str, Sequence[int]] | None = None,
        *,
        batch: int | None = None,
    ) -> Model:
        """Return a copy whose every input has a concrete shape.

        ``shapes`` maps an input name to its full shape, or a dim_param name (e.g. ``sequence``) to one
        value. ``batch`` binds axis 0 of every input whose first dim is not fixed. Named dims the model's
        metadata gives defaults for (zoo models) take them; an unbound axis 0 becomes 1 (with a note, as
        Polygraphy and onnxruntime_perf_test do); any other unbound dim is an error that names it.
        Sequence, optional and map inputs, and tensor inputs whose graph gives no shape at all, are left
        out of ``input_shapes`` (with a note for the tensors): the data given for them decides their shape.
        """
        return bind_shapes(self, dict(shapes or {}), batch)

    def cache_key(self) -> str:
        """A short digest of the model file (its size and mtime plus the graph), for compile caches."""
        st = self.path.stat()
        h = hashlib.sha256(f"{self.path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
        return h.hexdigest()[:16]

    def for_runtime(self, max_ir: int, max_opset: int, runtime: str) -> Model:
        """Return a model the runtime can read: the same one, or one with its IR version lowered.

        Lowering the IR version is safe when the model's default-domain opset is one that the lower IR
        version already allowed (onnx.helper.VERSION_TABLE) and no tensor uses an element type introduced
        after it. Otherwise raise ModelVersionError naming both versions.
        """
        if self.default_opset > max_opset:
            raise ModelVersionError(
                f"{self.source} uses opset {self.default_opset} of ai.onnx; {runtime} reads up to opset "
                f"{max_opset}.",
                f"Convert it: python -c \"import onnx, onnx.version_converter as vc; "
                f"onnx.save(vc.convert_version(onnx.load('{self.path}'), {max_opset}), 'model-op{max_opset}.onnx')\""
                f", or upgrade onnxruntime.",
            )
        if self.ir_version <= max_ir:
            return self
        needed = _min_ir_for_opset(self.default_opset)
        newer_types = sorted(t for t in _element_types(self.proto) if _TYPE_MIN_IR.get(t, 0) > max_ir)
        if needed > max_ir or newer_types:
            why = f"opset {self.default_opset} needs IR {needed}" if needed > max_ir else (
                f"it uses element types {', '.join(newer_types)}")
            raise ModelVersionError(
                f"{self.source} has IR version {self.ir_version}; {runtime} reads up to IR version "
                f"{max_ir}, and lowering it is not safe ({why}).",
                "Upgrade onnxruntime, or re-export the model with an older opset.",
            )
        fixed_path = _write_lowered_ir(self, max_ir)
        note = (
            f"{self.source} has IR version {self.ir_version}, newer than {runtime} reads "
            f"(max {max_ir}); running a copy stamped IR {max_ir}, which is safe for opset "
            f"{self.default_opset} (copy: {fixed_path})."
        )
        return dataclasses.replace(
            self, path=fixed_path, proto=onnx.load(str(fixed_path), load_external_data=False),
            notes=self.notes + (note,),
        )

    def to_dict(self) -> dict:
        """JSON-ready description of the model: source, opsets, inputs, outputs and bound shapes."""
        return {
            "source": self.source,
            "path": str(self.path),
            "ir_version": self.ir_version,
            "opsets": self.opsets,
            "producer": f"{self.proto.producer_name} {self.proto.producer_version}".strip(),
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
            "notes": list(self.notes),
        }


def load_model(source: str | os.PathLike, *, check: bool = True) -> Model:
    """Load a model from a path (external data beside it is fine) or a built-in ``zoo:NAME``."""
    text = str(source)
    if text.startswith(ZOO_PREFIX):
        path = zoo.get_model_path(text[len(ZOO_PREFIX):])
    else:
        path = Path(text).expanduser()
        _check_file(path, text)
    with startup.stage("model read", detail=path.name):
        proto = _parse(path)
        check_tensor_data(proto, path)
        if check and model_memo.facts(path).get("checked") != onnx.__version__:
            _check_graph(path)  # once per unchanged file and onnx version (model_memo.py)
            model_memo.remember(path, _data_files(proto, path), checked=onnx.__version__)
    return Model(
        source=text,
        path=path,
        proto=proto,
        inputs=tuple(_spec(v) for v in _graph_inputs(proto)),
        outputs=tuple(_spec(v) for v in proto.graph.output),
    )


def parse_shape_bindings(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Parse ``NAME=1x3x224x224`` (or ``NAME=1,3,224,224``; ``DIM=128`` for a dim_param) items."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        if not sep or not name or not re.fullmatch(r"\d+([x,]\d+)*", dims.strip()):
            raise ShapeError(
                f"Cannot read the shape binding '{item}'.",
                "Write NAME=1x3x224x224 for an input, or DIM=128 for a symbolic dimension.",
            )
        out[name.strip()] = tuple(int(d) for d in re.split(r"[x,]", dims.strip()))
    return out


def content_hash(path: Path) -> str:
    """sha256 of the model file and its external data files (kept while the files are unchanged: model_memo.py)."""
    path = Path(path).resolve()
    st = path.stat()
    return _content_hash(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _content_hash(path: str, size: int, mtime_ns: int) -> str:
    known = model_memo.facts(Path(path)).get("sha256")
    if known:
        return known
    files = [Path(path), *_data_files(onnx.load(path, load_external_data=False), Path(path))]
    digest = hashlib.sha256()
    for file in files:
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    model_memo.remember(Path(path), files[1:], sha256=digest.hexdigest())
    return digest.hexdigest()


def _data_files(proto: onnx.ModelProto, path: Path) -> list[Path]:
    """The external data files beside ``path`` that ``proto``'s tensors name, each once."""
    files: list[Path] = []
    for tensor in onnx.external_data_helper._get_all_tensors(proto):
        if onnx.external_data_helper.uses_external_data(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), None)
            if location and path.parent / location not in files and (path.parent / location).exists():
                files.append(path.parent / location)
    return files


# --- loading -------------------------------------------------------------------------------------------

def _check_file(path: Path, text: str) -> None:
    if path.is_dir():
        raise ModelNotFoundError(f"{text} is a directory, not an ONNX file.", "Pass the path of the .onnx file.")
    if path.exists():
        return
    hint = "Check the path, or use a built-in model: `onnxaccel zoo list`."
    if "/" not in text and not text.endswith(".onnx"):
        hint = f"Did you mean the built-in model zoo:{text}? See `onnxaccel zoo list`."
    raise ModelNotFoundError(f"Model file not found: {text}", hint)


def _parse(path: Path) -> onnx.ModelProto:
    not_onnx = ModelFormatError(
        f"{path} is not an ONNX model (its protobuf could not be parsed).",
        "Pass a .onnx file exported by torch.onnx, tf2onnx, skl2onnx or similar; if it is one, the file "
        "is truncated or corrupt: export or download it again.",
    )
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise not_onnx from exc
    # Arbitrary bytes sometimes parse as an (empty) protobuf message: demand a graph.
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.graph.node:
        raise not_onnx
    return proto


def _check_graph(path: Path) -> None:
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        if "ir_version" in first.lower() or "opset" in first.lower() and "higher" in first.lower():
            raise ModelVersionError(
                f"{path}: {first}",
                f"The installed onnx {onnx.__version__} is older than the model; upgrade onnx.",
            ) from exc
        raise ModelFormatError(
            f"{path} is not a valid ONNX graph: {first}",
            "Fix the exporter or the graph (onnx.checker.check_model shows the same error); "
            "`--no-check` skips this check if the runtime accepts the model anyway.",
            details=str(exc),
        ) from exc


def _graph_inputs(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    # IR < 4 lists initializers among the inputs too; those are weights, not feeds.
    initializers = {t.name for t in proto.graph.initializer}
    return [v for v in proto.graph.input if v.name not in initializers]


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    kind = (value.type.WhichOneof("value") or "tensor_type").removesuffix("_type")
    ttype = _innermost_tensor(value.type)
    elem = ttype.elem_type if ttype is not None else 0
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name
    except (KeyError, TypeError, ValueError):
        dtype = onnx.TensorProto.DataType.Name(elem).lower() if elem in onnx.TensorProto.DataType.values() else "?"
    shape: tuple[Dim, ...] | None = None
    if kind == "tensor" and ttype is not None and ttype.HasField("shape"):
        shape = tuple(_dim(d) for d in ttype.shape.dim)
    type_proto = onnx.TypeProto()
    type_proto.CopyFrom(value.type)
    return TensorSpec(value.name, dtype, shape, kind, elem, type_proto)


def _innermost_tensor(tp: onnx.TypeProto):
    """The tensor type at the bottom of a sequence/optional (a map's value type); None if there is none."""
    for _ in range(16):
        which = tp.WhichOneof("value")
        if which in ("tensor_type", "sparse_tensor_type"):
            return getattr(tp, which)
        if which == "sequence_type":
            tp = tp.sequence_type.elem_type
        elif which == "optional_type":
            tp = tp.optional_type.elem_type
        elif which == "map_type":
            tp = tp.map_type.value_type
        else:
            return tp.tensor_type if which is None else None
    return None


def _type_text(tp: onnx.TypeProto) -> str:
    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type", None):
        elem = getattr(tp, which or "tensor_type").elem_type
        name = onnx.TensorProto.DataType.Name(elem).lower() if elem in onnx.TensorProto.DataType.values() else "?"
        return f"{'sparse_tensor' if which == 'sparse_tensor_type' else 'tensor'}({name})"
    if which == "sequence_type":
        return f"seq({_type_text(tp.sequence_type.elem_type)})"
    if which == "optional_type":
        return f"optional({_type_text(tp.optional_type.elem_type)})"
    key = onnx.TensorProto.DataType.Name(tp.map_type.key_type).lower()
    return f"map({key},{_type_text(tp.map_type.value_type)})"


def _dim(d: onnx.TensorShapeProto.Dimension) -> Dim:
    # Exporters write unknown dims as dim_value -1 or 0 (Paddle), or as the dim_param "?" repeated on several
    # axes; none of those names a dimension shared between axes, so all of them are "unknown".
    if d.HasField("dim_value"):
        return d.dim_value if d.dim_value > 0 else None
    return d.dim_param if d.dim_param and d.dim_param != "?" else None


# --- IR compatibility ----------------------------------------------------------------------------------

def _min_ir_for_opset(opset: int) -> int:
    candidates = [ir for _, ir, op, *_ in helper.VERSION_TABLE if op >= opset]
    return min(candidates) if candidates else onnx.IR_VERSION


def _element_types(proto: onnx.ModelProto) -> set[str]:
    names = set()
    for t in proto.graph.initializer:
        names.add(onnx.TensorProto.DataType.Name(t.data_type))
    for v in list(proto.graph.input) + list(proto.graph.output) + list(proto.graph.value_info):
        names.add(onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type))
    return names


def _write_lowered_ir(model: Model, ir: int) -> Path:
    target = runtime_models_dir() / f"{model.path.stem}-{model.cache_key()}-ir{ir}.onnx"
    if target.exists():
        return target
    full = onnx.load(str(model.path), load_external_data=True)
    full.ir_version = ir
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    large = full.ByteSize() > 1_800_000_000
    onnx.save(full, str(tmp), save_as_external_data=large, location=target.name + ".data" if large else None)
    os.replace(tmp, target)
    return target
