"""Writing transformed models: never over the user's input, never half a file, weights outside when large.

Protobuf cannot serialize a message over 2 GiB (onnx.checker / onnx.save raise "Message onnx.ModelProto
exceeds maximum protobuf size of 2GB"), so larger models keep their weights in one external data file
beside the .onnx (onnx.save_model(save_as_external_data=True)).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import onnx

from onnxaccel.errors import ModelError, UsageError

#: Metadata key every optimized model carries (the input file's name); marks files `optimize` may replace.
OPTIMIZED_FROM_KEY = "onnxaccel.optimized_from"
#: Above this, weights go to an external data file (protobuf's hard limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


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


def save_model(proto: onnx.ModelProto, path: Path, *, converter: str) -> Path:
    """Write ``proto`` (weights loaded) to ``path`` atomically (temporary file + os.replace); external data
    when large.

    Every model goes through :func:`onnxaccel.transform.checkpoint.validate` first (topological order, full
    ONNX check); ``converter`` names the step that produced it in the error when it fails, and then nothing
    is written. With external data, the weights file is named ``<file>.data`` beside the model; an older one
    of that name is replaced.
    """
    from onnxaccel.transform.checkpoint import IN_MEMORY_LIMIT, sort_graph, validate

    path = Path(path)
    if proto.ByteSize() <= IN_MEMORY_LIMIT:
        validate(proto, converter)
    else:
        sort_graph(proto.graph)  # checked below, from the file
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    large = proto.ByteSize() > EXTERNAL_DATA_THRESHOLD
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
        tmp_model = Path(tmp) / path.name
        try:
            if large:
                onnx.save_model(proto, str(tmp_model), save_as_external_data=True, all_tensors_to_one_file=True,
                                location=path.name + ".data", size_threshold=1024)
                validate(proto, converter, path=tmp_model)
                os.replace(Path(tmp) / (path.name + ".data"), path.parent / (path.name + ".data"))
            else:
                onnx.save_model(proto, str(tmp_model))
            os.replace(tmp_model, path)
        except OSError as exc:
            raise _unwritable(path, exc) from exc
    return path


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
