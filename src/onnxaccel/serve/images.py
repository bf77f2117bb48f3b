"""Encoded images over the wire: a served image model also takes a ``BYTES`` input with one JPEG/PNG per batch
row, as KServe's image transformer and Triton's preprocessing ensembles accept (the client sends the file, the
server decodes). The server decodes each row, applies the preset's geometry (resize + center crop, letterbox, or
resize) and, for a model taking float NCHW, the preset's scale/mean/std; a model with its preprocessing embedded
in the graph (``optimize --embed-preprocess``) gets the uint8 NHWC pixels as they are. The decoded tensor then
replaces the BYTES input and the request is validated and batched like any other.

Which input takes images (:func:`image_input_of`):
- a model with embedded preprocessing: the input its metadata names (uint8 [N, H, W, 3]), with its preset;
- else the one 4-D float input [N, 3, H, W] with fixed H and W, when a preset is known: the serve option
  ``--preprocess`` (a model config's ``preprocess`` key), else the model's metadata (prepost/presets.py rules).
A model whose preset is unknown does not take images (a BYTES request gets a 400 saying how to set one).

Decoding runs in a thread pool sized by the cores, off the event loop, so the loop keeps accepting requests
while images decode. How far the threads run in parallel depends on Pillow releasing the GIL inside its C
decoders and resampling; that was not checked against Pillow's source nor measured here (with ``--workers`` the
processes give parallelism regardless).
JPEGs are decoded at reduced size where the target is smaller (prepost/cpu_decode.py ``decode_pixels``).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from onnxaccel.inputs_files import ImagePreprocess
from onnxaccel.model import Model, TensorSpec
from onnxaccel.prepost.cpu_decode import decode_pixels
from onnxaccel.prepost.presets import PreprocessRequest, resolve_preprocess
from onnxaccel.serve.protocol import InferRequest, bad_request, datatype_of

#: The metadata key ``optimize --embed-preprocess`` writes (transform/embed_preprocess.py META_EMBEDDED; a
#: feature serve may not import, so the key is repeated here and a test holds the two equal).
META_EMBEDDED = "onnxaccel.embedded_preprocess"
#: What the model metadata's ``parameters`` and Triton's config ``parameters`` call the image input.
PARAMETER = "image_input"


@dataclass(frozen=True)
class ImageInput:
    """The input a served model takes encoded images for, and how a decoded image becomes its tensor."""

    name: str
    height: int
    width: int
    #: "uint8_nhwc" (preprocessing embedded in the graph) or "float_nchw" (scale/mean/std done here).
    layout: str
    dtype: str
    pre: ImagePreprocess

    def to_dict(self) -> dict:
        """What the model metadata advertises: the input, the datatype to send, what it is decoded to."""
        shape = [-1, self.height, self.width, 3] if self.layout == "uint8_nhwc" else [-1, 3, self.height, self.width]
        return {"name": self.name, "datatype": "BYTES", "shape": [-1], "content": ["image/jpeg", "image/png"],
                "preset": self.pre.preset, "decoded_to": {"datatype": datatype_of(self.dtype), "shape": shape},
                "embedded_preprocess": self.layout == "uint8_nhwc"}


def image_input_of(model: Model, preprocess: str | None = None) -> ImageInput | None:
    """The input of ``model`` that takes encoded images (module docstring), or None."""
    metadata = model.metadata
    embedded = _embedded(metadata)
    if embedded is not None:
        spec = next((s for s in model.inputs if s.name == embedded.get("input")), None)
        hw = _fixed_hw(spec, (1, 2)) if spec is not None else None
        if hw is None or datatype_of(spec.dtype) != "UINT8":
            return None
        pre = resolve_preprocess(metadata, PreprocessRequest(preset=embedded.get("preset", "none")))
        return ImageInput(spec.name, hw[0], hw[1], "uint8_nhwc", "uint8", pre)
    images = [s for s in model.inputs if _float_nchw(s)]
    if len(images) != 1:
        return None
    spec = images[0]
    pre = resolve_preprocess(metadata, PreprocessRequest(preset=preprocess))
    if preprocess is None and pre.origin.startswith("default"):
        return None  # the metadata names no preset: which normalization the model wants is unknown
    hw = _fixed_hw(spec, (2, 3))
    return ImageInput(spec.name, hw[0], hw[1], "float_nchw", str(np.dtype(spec.dtype)), pre)


def _embedded(metadata: dict[str, str]) -> dict | None:
    text = metadata.get(META_EMBEDDED)
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _fixed_hw(spec: TensorSpec, axes: tuple[int, int]) -> tuple[int, int] | None:
    shape = spec.shape
    if shape is None or len(shape) != 4:
        return None
    h, w = shape[axes[0]], shape[axes[1]]
    return (h, w) if isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0 else None


def _float_nchw(spec: TensorSpec) -> bool:
    return (np.dtype(spec.dtype).kind == "f" and _fixed_hw(spec, (2, 3)) is not None
            and spec.shape[1] == 3)


# --- decoding -----------------------------------------------------------------------------------------------

_POOL: ThreadPoolExecutor | None = None


def decode_pool(workers: int = 1) -> ThreadPoolExecutor:
    """The process's decoding threads: the cores shared among the server's worker processes."""
    global _POOL
    if _POOL is None:
        size = max(1, (os.cpu_count() or 1) // max(1, workers))
        _POOL = ThreadPoolExecutor(max_workers=size, thread_name_prefix="image-decode")
    return _POOL


def decode_row(data: bytes, image: ImageInput, row: int) -> np.ndarray:
    """One encoded image -> the model's tensor for one row (uint8 HWC or float CHW). 400 naming the input and
    row when the bytes are not an image Pillow reads."""
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise bad_request(f"Input '{image.name}' row {row}: an empty BYTES element; send one JPEG or PNG file "
                          "per row.")
    try:
        pixels = decode_pixels(io.BytesIO(data), image.height, image.width, image.pre)
    except Exception as exc:  # noqa: BLE001 - Pillow raises OSError, ValueError, SyntaxError, DecompressionBombError
        cause = exc.__cause__ or exc  # decode_pixels wraps Pillow's error in an InputError naming the file object
        reason = re.sub(r" <_io\.BytesIO object at 0x[0-9a-f]+>", "", str(cause)) or type(cause).__name__
        raise bad_request(f"Input '{image.name}' row {row}: the {len(data)} bytes are not a readable image "
                          f"({reason.splitlines()[0][:200]}); send one JPEG or PNG file per row.") from None
    if image.layout == "uint8_nhwc":
        return pixels
    pre = image.pre
    arr = pixels.astype(np.float32)  # as inputs_files.read_image does for a file
    arr = (arr * np.float32(pre.scale) - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    return np.ascontiguousarray(arr.transpose(2, 0, 1).astype(image.dtype))


def rows_of(value: np.ndarray, name: str) -> list:
    """The encoded images of a BYTES input: shape [N] or [N, 1], one file per row."""
    if value.ndim == 0 or value.ndim > 2 or (value.ndim == 2 and value.shape[1] != 1):
        raise bad_request(f"Input '{name}' is BYTES with shape {list(value.shape)}; encoded images go as shape [N] "
                          "or [N, 1], one JPEG/PNG file per batch row.")
    return list(value.reshape(-1))


async def decode_request(request: InferRequest, image: ImageInput | None, workers: int = 1) -> None:
    """Replace a BYTES image input of ``request`` by its decoded tensor (in the decoding threads); a request
    without one is left as it is."""
    if image is None or request.datatypes.get(image.name) != "BYTES" or image.name not in request.inputs:
        return
    rows = rows_of(request.inputs[image.name], image.name)
    if not rows:
        raise bad_request(f"Input '{image.name}' has no rows; send one JPEG or PNG file per batch row.")
    loop = asyncio.get_running_loop()
    pool = decode_pool(workers)
    decoded = await asyncio.gather(*(loop.run_in_executor(pool, decode_row, data, image, row)
                                     for row, data in enumerate(rows)))
    request.inputs[image.name] = np.stack(decoded) if decoded else np.zeros((0,), image.dtype)
    request.datatypes[image.name] = datatype_of(image.dtype)

