"""Opset and IR-version conversion (onnx.version_converter), for runtimes and passes that need a given opset.

``onnx.version_converter.convert_version`` rewrites ops whose semantics changed between opsets and raises
when it has no adapter for an op; the IR version is then set to the lowest one that carries the opset
(onnx.helper.VERSION_TABLE), so older runtimes still read the file.
"""

from __future__ import annotations

import onnx
from onnx import helper

from onnxaccel.errors import ModelVersionError, UsageError


def default_opset(proto: onnx.ModelProto) -> int:
    """The model's default-domain opset version (0 when it declares none)."""
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def ir_version_for_opset(opset: int) -> int:
    """The lowest IR version that allows ``opset`` of the default domain.

    Rows of onnx.helper.VERSION_TABLE are (onnx release, IR version, ai.onnx opset, ai.onnx.ml, training).
    """
    candidates = [row[1] for row in helper.VERSION_TABLE if row[2] >= opset]
    if not candidates:
        raise ModelVersionError(f"opset {opset} is newer than the installed onnx {onnx.__version__} knows.",
                                "Upgrade onnx, or choose a lower --opset.")
    return min(candidates)


def convert_opset(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """A copy of ``proto`` converted to ``opset`` and stamped with the lowest IR version for it."""
    newest = onnx.defs.onnx_opset_version()
    if not 7 <= opset <= newest:
        raise UsageError(f"--opset {opset} is outside what the installed onnx converts (7..{newest}).",
                         f"Choose an opset between 7 and {newest}.")
    current = default_opset(proto)
    if current == opset:
        return proto
    try:
        converted = onnx.version_converter.convert_version(proto, opset)
    except Exception as exc:  # noqa: BLE001 - the converter raises RuntimeError/ValueError/ConvertError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelVersionError(
            f"Converting the model from opset {current} to {opset} failed: {first}",
            "onnx.version_converter has no adapter for one of its ops; re-export the model at the opset you "
            "need, or choose an opset closer to the current one.", details=str(exc),
        ) from exc
    converted.ir_version = max(ir_version_for_opset(opset), _min_ir(converted))
    return converted


def set_ir_version(proto: onnx.ModelProto, ir_version: int) -> onnx.ModelProto:
    """Stamp ``ir_version`` when the model's opset allows it; raise otherwise."""
    need = max(ir_version_for_opset(default_opset(proto)), _min_ir(proto))
    if ir_version < need:
        raise ModelVersionError(
            f"IR version {ir_version} cannot carry this model (opset {default_opset(proto)} and its element types "
            f"need IR {need}).", f"Use --ir-version {need} or higher, or lower the opset first (--opset).")
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    copy.ir_version = ir_version
    return copy


def _min_ir(proto: onnx.ModelProto) -> int:
    """The IR version other domains (e.g. ai.onnx.ml) need; 3 when nothing else constrains it."""
    need = 3
    for entry in proto.opset_import:
        if entry.domain == "ai.onnx.ml":
            rows = [row[1] for row in helper.VERSION_TABLE if row[3] >= entry.version]
            need = max(need, min(rows) if rows else need)
    return need
