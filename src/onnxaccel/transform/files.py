"""Writing transformed models: never over the user's input, never half a file, weights outside when large.

The checked, atomic write itself (and the external data rule for models over protobuf's 2 GiB) is
:func:`onnxaccel.precision.checkpoint.save_model`, which the pipeline's precision variants use too; this module
adds what `optimize` needs around it: the output path rules, copies and sizes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import onnx

from onnxaccel.errors import ModelError, UsageError
from onnxaccel.precision.checkpoint import save_model

#: Metadata key every optimized model carries (the input file's name); marks files `optimize` may replace.
OPTIMIZED_FROM_KEY = "onnxaccel.optimized_from"


def check_output_path(source: Path, output: Path, *, force: bool = False) -> Path:
    """Refuse to write over the input model (or its external data) unless ``force``; refuse directories."""
    output = Path(output).expanduser()
    if output.is_dir():
        raise UsageError(f"-o {output} is a directory.", f"Give a file name, e.g. -o {output / 'model.opt.onnx'}.")
    if output.suffix.lower() != ".onnx":
        raise UsageError(f"-o {output} does not end in .onnx.", f"Write the model as {output.with_suffix('.onnx')}.")
    same = output.exists() and source.exists() and os.path.samefile(output, source)
    if same and not force:
        raise UsageError(
            f"-o {output} is the input model; optimizing in place would destroy the original.",
            "Write to another file (e.g. -o model.opt.onnx), or pass --force to replace the input.",
        )
    if output.exists() and not force and not same and not written_by_us(output):
        raise UsageError(f"{output} already exists and was not written by onnxaccel optimize.",
                         "Choose another -o, or pass --force to overwrite it.")
    return output


def written_by_us(path: Path) -> bool:
    """True for a model an earlier `optimize` wrote (it carries onnxaccel.optimized_from metadata)."""
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - not a model we can read: not ours to overwrite
        return False
    return any(p.key == OPTIMIZED_FROM_KEY for p in proto.metadata_props)


def copy_model(source: Path, dest: Path) -> Path:
    """Copy a model file and its external data files (``location`` entries) to ``dest``."""
    dest = Path(dest)
    proto = onnx.load(str(source), load_external_data=False)
    if _all_inline(proto):
        try:
            shutil.copyfile(source, dest)
        except OSError as exc:
            raise _unwritable(dest, exc) from exc
        return dest
    full = onnx.load(str(source), load_external_data=True)
    return save_model(full, dest, converter="copy")


def file_size(path: Path) -> int:
    """Bytes of the model file plus every external data file it names."""
    path = Path(path)
    total = path.stat().st_size
    proto = onnx.load(str(path), load_external_data=False)
    seen = set()
    for tensor in onnx.external_data_helper._get_all_tensors(proto):
        if onnx.external_data_helper.uses_external_data(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), None)
            if location and location not in seen and (path.parent / location).exists():
                seen.add(location)
                total += (path.parent / location).stat().st_size
    return total


def _all_inline(proto: onnx.ModelProto) -> bool:
    return not any(onnx.external_data_helper.uses_external_data(t)
                   for t in onnx.external_data_helper._get_all_tensors(proto))


def _unwritable(path: Path, exc: OSError) -> ModelError:
    return ModelError(f"Cannot write {path}: {exc.strerror or exc}.", "Choose a writable location for -o.",
                      details=str(exc))
