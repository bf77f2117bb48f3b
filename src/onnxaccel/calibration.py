"""Calibration (and evaluation) samples for INT8: a folder of images, an .npz, a folder of .npy/.npz files,
or synthetic data.

Every sample is checked against the bound model's signature (names, dtypes, shapes) before quantization
starts, so bad data fails in seconds with the file and the expected shape, not deep inside ONNX Runtime's
calibrator. Synthetic data is allowed but flagged: ranges measured on random inputs say nothing about real
ones, so the quantized model's accuracy is meaningless for real inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnxaccel.errors import InputError, OnnxAccelError
from onnxaccel.inputs import IMAGE_SUFFIXES, ImagePreprocess, load_image, synthesize, validate_feeds
from onnxaccel.model import Model

SYNTHETIC = "synthetic"
SYNTHETIC_WARNING = (
    "INT8 calibrated on SYNTHETIC random data: the activation ranges come from noise, not from real inputs, so "
    "the quantized model's accuracy on real data is unknown and usually poor. Use it only to test the "
    "pipeline; calibrate with --calibration DIR_OF_IMAGES or FILE.npz for a model you will use."
)
DEFAULT_MAX_SAMPLES = 128


class CalibrationError(OnnxAccelError):
    """Calibration data that cannot be used: missing, empty, unreadable or of the wrong shape."""

    exit_code = 2


@dataclass
class CalibrationData:
    """Samples (one feed dict each, at the model's bound shapes) and where they came from."""

    samples: list[dict[str, np.ndarray]]
    source: str
    kind: str  # images | npz | files | synthetic
    files: list[str] = field(default_factory=list)

    @property
    def synthetic(self) -> bool:
        """True when the samples were synthesized (INT8 scales from them are not representative)."""
        return self.kind == SYNTHETIC

    def to_dict(self) -> dict:
        """JSON-ready summary (source, kind, sample count) with the synthetic-data warning when it applies."""
        return {"source": self.source, "kind": self.kind, "samples": len(self.samples),
                "synthetic": self.synthetic, "warning": SYNTHETIC_WARNING if self.synthetic else None}

    def reader(self):
        """An onnxruntime.quantization CalibrationDataReader over the samples."""
        from onnxruntime.quantization import CalibrationDataReader

        samples = self.samples

        class _Reader(CalibrationDataReader):
            def __init__(self):
                self._it: Iterator = iter(samples)

            def get_next(self):
                return next(self._it, None)

            def rewind(self):
                self._it = iter(samples)

        return _Reader()


def load_calibration(
    spec: str,
    model: Model,
    *,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    preprocess: ImagePreprocess | None = None,
    seed: int = 0,
) -> CalibrationData:
    """Read calibration samples for a bound ``model`` from ``spec``: a folder, a file, or ``synthetic``."""
    if not model.is_bound:
        model = model.bind()
    if max_samples < 1:
        raise CalibrationError(f"--calibration-samples must be at least 1, got {max_samples}.",
                               "e.g. --calibration-samples 64")
    if spec.strip().lower() == SYNTHETIC:
        samples = [synthesize(model, seed=seed + i) for i in range(min(max_samples, 16))]
        return CalibrationData(samples, SYNTHETIC, SYNTHETIC)
    path = Path(spec).expanduser()
    if not path.exists():
        raise CalibrationError(
            f"Calibration data not found: {spec}",
            "Give a folder of images, an .npz whose arrays are named after the model's inputs, a folder of "
            ".npy/.npz files, or `synthetic` (testing only).",
        )
    if path.is_dir():
        return _from_folder(path, model, max_samples, preprocess or ImagePreprocess())
    if path.suffix.lower() == ".npz":
        return _from_npz(path, model, max_samples)
    if path.suffix.lower() == ".npy":
        return _from_npy(path, model, max_samples)
    raise CalibrationError(f"Cannot use {path} as calibration data: unknown file type '{path.suffix}'.",
                           "Use a folder of images, a .npz, a .npy, or a folder of .npy/.npz files.")


def _from_folder(path: Path, model: Model, max_samples: int, pre: ImagePreprocess) -> CalibrationData:
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    arrays = [p for p in files if p.suffix.lower() in (".npy", ".npz")]
    if not images and not arrays:
        others = ", ".join(p.name for p in files[:3])
        raise CalibrationError(
            f"The calibration folder {path} has no images or .npy/.npz files"
            + (f" (it has: {others}{', ...' if len(files) > 3 else ''})." if files else " (it is empty)."),
            f"Put a few hundred representative inputs there: images ({', '.join(sorted(IMAGE_SUFFIXES))}) or "
            ".npy/.npz arrays named after the model's inputs.",
        )
    if images and arrays:
        raise CalibrationError(f"The calibration folder {path} mixes images and arrays.",
                               "Keep one kind of file per calibration folder.")
    if images:
        return CalibrationData(_image_samples(images[:_image_budget(model, max_samples)], model, pre), str(path),
                               "images", [str(p) for p in images])
    samples = []
    for file in arrays[:max_samples]:
        one = _from_npz(file, model, 1) if file.suffix.lower() == ".npz" else _from_npy(file, model, 1)
        samples.extend(one.samples)
    return CalibrationData(samples, str(path), "files", [str(p) for p in arrays])


def _image_budget(model: Model, max_samples: int) -> int:
    batch = _batch(model)
    return max_samples * batch


def _image_samples(images: list[Path], model: Model, pre: ImagePreprocess) -> list[dict[str, np.ndarray]]:
    spec = _single_image_input(model)
    shape = model.input_shapes[spec.name]
    batch = shape[0]
    one = (1,) + tuple(shape[1:])
    tensors = []
    for image in images:
        try:
            tensors.append(load_image(image, spec, one, pre))
        except OnnxAccelError as exc:
            raise CalibrationError(f"Calibration image {image} cannot be used: {exc.message}",
                                   "Remove or replace the file; every file in the folder must be a readable image.",
                                   details=exc.details) from exc
    if len(tensors) < batch:
        raise CalibrationError(f"{len(tensors)} calibration image(s) cannot fill one batch of {batch}.",
                               f"Add images, or bind a smaller batch (--shape {spec.name}=1x...).")
    samples = []
    for start in range(0, len(tensors) - batch + 1, batch):
        value = np.concatenate(tensors[start:start + batch])
        samples.append(_checked(model, {**_others(model, spec.name), spec.name: value}, str(images[start])))
    return samples


def _single_image_input(model: Model):
    image_like = [s for s in model.inputs if s.shape is not None and len(s.shape) == 4 and s.dtype.startswith("float")]
    if len(model.inputs) == 1 and image_like:
        return image_like[0]
    raise CalibrationError(
        f"A folder of images can calibrate a model with one 4-D float input; this one has "
        f"{', '.join(f'{s.name} {s.shape_text()} {s.dtype}' for s in model.inputs)}.",
        "Give an .npz whose arrays are named after the inputs, with one sample per row of axis 0.",
    )


def _others(model: Model, skip: str) -> dict[str, np.ndarray]:
    return {k: v for k, v in synthesize(model).items() if k != skip}


def _from_npz(path: Path, model: Model, max_samples: int) -> CalibrationData:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:  # noqa: BLE001 - numpy raises ValueError/OSError/BadZipFile/EOFError
        raise CalibrationError(f"Cannot read {path}: {type(exc).__name__}: {exc}",
                               "Write calibration data with numpy.savez(path, INPUT_NAME=array, ...).") from exc
    names = [s.name for s in model.inputs]
    if len(arrays) == 1 and len(names) == 1 and names[0] not in arrays:
        arrays = {names[0]: next(iter(arrays.values()))}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise CalibrationError(
            f"{path} has no array for input(s) {', '.join(missing)} (it has: {', '.join(arrays) or 'none'}).",
            "Name the arrays after the model's inputs: numpy.savez(path, " +
            ", ".join(f"{n}=..." for n in names) + ").",
        )
    return CalibrationData(_split(arrays, model, max_samples, str(path)), str(path), "npz", [str(path)])


def _from_npy(path: Path, model: Model, max_samples: int) -> CalibrationData:
    if len(model.inputs) != 1:
        raise CalibrationError(f"{path} is one array, but the model has {len(model.inputs)} inputs.",
                               "Use an .npz with one array per input name.")
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001
        raise CalibrationError(f"Cannot read {path}: {type(exc).__name__}: {exc}",
                               "Write it with numpy.save(path, array).") from exc
    return CalibrationData(_split({model.inputs[0].name: array}, model, max_samples, str(path)), str(path), "npz",
                           [str(path)])


def _split(arrays: dict[str, np.ndarray], model: Model, max_samples: int, where: str) -> list[dict[str, np.ndarray]]:
    """Arrays of the input's rank are batches along axis 0; one more axis in front indexes samples."""
    per_input: dict[str, list[np.ndarray]] = {}
    for spec in model.inputs:
        array = np.asarray(arrays[spec.name])
        want = np.dtype(spec.dtype)
        if array.dtype.kind == "f" and want.kind == "f" and array.dtype != want:
            array = array.astype(want)  # numpy writes float64 by default; ranges survive the cast
        shape = tuple(model.input_shapes[spec.name])
        if array.ndim == len(shape) + 1 and tuple(array.shape[1:]) == shape:
            per_input[spec.name] = list(array)
        elif array.ndim == len(shape) and tuple(array.shape[1:]) == shape[1:] and array.shape[0] >= shape[0]:
            rows = array.shape[0] - array.shape[0] % shape[0]
            per_input[spec.name] = [array[i:i + shape[0]] for i in range(0, rows, shape[0])]
        else:
            raise CalibrationError(
                f"Calibration array '{spec.name}' in {where} has shape {list(array.shape)}; the model takes "
                f"{list(shape)} per run.",
                f"Stack samples along a new axis 0 (shape [N, {', '.join(map(str, shape))}]) or along the batch "
                f"axis (shape [N, {', '.join(map(str, shape[1:]))}]); bind other shapes with --shape.",
            )
    count = min(len(v) for v in per_input.values())
    if count == 0:
        raise CalibrationError(f"{where} holds no samples.", "Give at least one sample per input.")
    return [_checked(model, {k: v[i] for k, v in per_input.items()}, where) for i in range(min(count, max_samples))]


def _checked(model: Model, feeds: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    try:
        return validate_feeds(model, feeds)
    except InputError as exc:
        raise CalibrationError(f"Calibration data from {where} does not fit the model: {exc.message}",
                               exc.hint) from exc


def _batch(model: Model) -> int:
    shapes = list(model.input_shapes.values())
    return int(shapes[0][0]) if shapes and shapes[0] else 1
