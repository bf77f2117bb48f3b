"""INT8 calibration tables for providers that quantize by themselves (MIGraphX EP, TensorRT EP).

Both providers read a table through ``ReadDynamicRange`` (onnxruntime, migraphx_execution_provider_utils.h
and tensorrt_execution_provider_utils.h, microsoft/onnxruntime at 03c1250), in one of two formats:

* ``*_use_native_calibration_table=0``: "ORT generated calibration table ... pre-serialized by flatbuffers.
  Each entry in the table is a key-value pair, key: tensor name, value: maximum absolute value in floating
  point" (a string), in the ``CalTableFlatBuffers.TrtTable`` schema shipped with onnxruntime.quantization.
* ``=1``: a TensorRT calibration cache: a first line containing ``TRT-`` (e.g.
  ``TRT-7103-EntropyCalibration2``), then ``tensor name: scale`` lines, the scale being the float32 bit
  pattern in hex; the reader takes ``dynamic_range = scale * 127``. Any other first line fails with "This is
  not a TensorRT generated calibration table <file>".

We write the absolute maximum of each calibrated range (ORT's own ``write_calibration_table`` writes
``max(highest, lowest)``, which is not the absolute maximum when a range is mostly negative).

The MIGraphX EP gets no table from here: every build read reads the table into a local map and hands
``migraphx::quantize_int8`` a member map that nothing fills (microsoft/onnxruntime v1.22.1
migraphx_execution_provider.cc L151/L1175, ROCm/onnxruntime rel-1.22.1 L162/L1445, microsoft 03c1250 the
same), so MIGraphX would calibrate on uninitialized values. ``write_table`` refuses it with that reason
(engines/ort_ep_options.py, which also refuses the option at session time); the QDQ model (``--int8 static``
without ``--native``) carries its scales in the graph, runs in INT8 on MIGraphX, and is the path whose
accuracy `optimize` measures.
"""

from __future__ import annotations

import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from onnxaccel import providers
from onnxaccel.engines.ort_ep_options import calibration_table_refusal
from onnxaccel.errors import MissingDependencyError, ModelError
from onnxaccel.target import Target
from onnxaccel.calibration import CalibrationData

#: ONNX Runtime's name for the CPU provider (from the registry: only providers/ and engines/ spell it).
_CPU = providers.get("cpu").provider

FLATBUFFERS_NAME = "calibration.flatbuffers"
TENSORRT_NAME = "calibration.cache"
#: First line of the TensorRT-format table. The reader only checks for "TRT-"; 8600 is a TensorRT 8.6-style
#: version stamp and MinMaxCalibration the calibrator name TensorRT writes for min-max ranges.
TENSORRT_HEADER = "TRT-8600-MinMaxCalibration"


@dataclass
class CalibrationTable:
    """An INT8 calibration table written for an EP: where, in which format, how many tensors, and
    the provider options that make the EP read it."""
    path: Path
    native: bool
    entries: int
    options: dict[str, str]

    def to_dict(self) -> dict:
        """The table as JSON-ready values, its format named."""
        return {"path": str(self.path), "format": "tensorrt-text" if self.native else "ort-flatbuffers",
                "entries": self.entries, "provider_options": self.options}


def compute_ranges(proto: onnx.ModelProto, data: CalibrationData, method: str = "minmax") -> dict[str, float]:
    """Absolute maximum of every float tensor the calibrator watches (inputs and node outputs)."""
    try:
        from onnxruntime.quantization import CalibrationMethod
        from onnxruntime.quantization.calibrate import create_calibrator
    except ImportError as exc:
        raise MissingDependencyError("onnxruntime", "cpu", "INT8 calibration") from exc
    calib = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
             "percentile": CalibrationMethod.Percentile}[method]
    with tempfile.TemporaryDirectory(prefix="onnxaccel-calib-") as tmp:
        source = Path(tmp) / "model.onnx"
        onnx.save_model(proto, str(source), save_as_external_data=proto.ByteSize() > 1_800_000_000)
        try:
            # symmetric ranges: both providers take one magnitude per tensor
            calibrator = create_calibrator(source, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                           calibrate_method=calib, providers=[_CPU],
                                           extra_options={"symmetric": True})
            calibrator.collect_data(data.reader())
            ranges = calibrator.compute_data()
        except Exception as exc:  # noqa: BLE001 - the calibrator raises plain exceptions
            raise ModelError(f"Calibration failed: {type(exc).__name__}: {exc}",
                             "Check the calibration data against the model's inputs (`onnxaccel inspect`).",
                             details=repr(exc)) from exc
    out = {}
    for name, tensor in ranges.data.items():
        low, high = (float(np.asarray(v).max()) if i else float(np.asarray(v).min())
                     for i, v in enumerate(tensor.range_value))
        out[name] = max(abs(low), abs(high))
    return out


def write_flatbuffers(ranges: dict[str, float], path: Path) -> Path:
    """The ORT-generated format (``use_native_calibration_table=0``)."""
    import flatbuffers
    from onnxruntime.quantization.CalTableFlatBuffers import KeyValue, TrtTable

    builder = flatbuffers.Builder(1024)
    entries = []
    for key in sorted(ranges):
        k = builder.CreateString(key)
        v = builder.CreateString(repr(float(ranges[key])))
        KeyValue.KeyValueStart(builder)
        KeyValue.KeyValueAddKey(builder, k)
        KeyValue.KeyValueAddValue(builder, v)
        entries.append(KeyValue.KeyValueEnd(builder))
    TrtTable.TrtTableStartDictVector(builder, len(entries))
    for entry in reversed(entries):
        builder.PrependUOffsetTRelative(entry)
    vector = builder.EndVector()
    TrtTable.TrtTableStart(builder)
    TrtTable.TrtTableAddDict(builder, vector)
    builder.Finish(TrtTable.TrtTableEnd(builder))
    path.write_bytes(bytes(builder.Output()))
    return path


def write_tensorrt(ranges: dict[str, float], path: Path) -> Path:
    """The TensorRT text format (``use_native_calibration_table=1``): ``name: <hex float32 of range/127>``."""
    bad = [k for k in ranges if ":" in k or "\n" in k]
    if bad:
        raise ModelError(f"Tensor name(s) {', '.join(bad[:3])} contain ':' and cannot be written to a TensorRT-format "
                         "table (the reader splits lines at ':').", "Use the flatbuffers table (the default).")
    lines = [TENSORRT_HEADER]
    for key in sorted(ranges):
        bits = struct.unpack(">I", struct.pack(">f", float(ranges[key]) / 127.0))[0]
        lines.append(f"{key}: {bits:08x}")
    path.write_text("\n".join(lines) + "\n")
    return path


def read_table(path: Path, native: bool) -> dict[str, float]:
    """Parse a table back the way ReadDynamicRange does (used to verify what we wrote)."""
    if native:
        lines = Path(path).read_text().splitlines()
        if not lines or "TRT-" not in lines[0].split(":")[0]:
            raise ModelError(f"This is not a TensorRT generated calibration table {path}", None)
        out = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            scale = struct.unpack(">f", struct.pack(">I", int(value.strip(), 16)))[0]
            out[name] = scale * 127.0
        return out
    from onnxruntime.quantization.CalTableFlatBuffers import TrtTable

    table = TrtTable.TrtTable.GetRootAsTrtTable(Path(path).read_bytes(), 0)
    return {table.Dict(i).Key().decode(): float(table.Dict(i).Value()) for i in range(table.DictLength())}


def write_table(ranges: dict[str, float], folder: Path, target: Target, *, native: bool = False) -> CalibrationTable:
    """Write the table into ``folder`` and return it with the provider options that load it.

    The option gets an absolute path: the providers resolve the name against ORT_MIGRAPHX_CACHE_PATH /
    trt_engine_cache_path when those are set, and joining a directory with an absolute path keeps the
    absolute path (std::filesystem::path::operator/).

    For MIGraphX it refuses, saying why and what to do instead (the EP never uses the table's values).
    """
    if target.device == "migraphx":
        raise calibration_table_refusal()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (TENSORRT_NAME if native else FLATBUFFERS_NAME)
    (write_tensorrt if native else write_flatbuffers)(ranges, path)
    read_back = read_table(path, native)
    if set(read_back) != set(ranges):
        raise ModelError(f"The calibration table {path} does not read back as written.", "Report this as a bug.")
    options = {}
    keys = providers.get(target.device).calibration_options
    if keys:
        enable, name, native_key = keys
        options = {enable: "1", name: str(path.resolve()), native_key: "1" if native else "0"}
    return CalibrationTable(path, native, len(ranges), options)
