"""A served model's signature: what serving it needs to know without running it. Request validation (the
runner's feed check, feeds_check.py, worded for the protocol), the protocol's model metadata and
Triton's model config. The decoding workers of ``--shared-models`` get only this from the model process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from onnxaccel.feeds_check import FeedCheck, FeedProblem
from onnxaccel.model import TensorSpec
from onnxaccel.serve.config import ModelConfig
from onnxaccel.serve.images import PARAMETER, ImageInput
from onnxaccel.serve.protocol import InferRequest, bad_request, datatype_of

VERSION = "1"
PLATFORM = "onnxruntime_onnx"  # Triton's platform name for ONNX models (model_config.proto "platform")


def metadata_shape(spec: TensorSpec) -> list[int]:
    """The protocol's shape of an input or output: -1 for every variable axis."""
    return [-1 if not isinstance(d, int) else d for d in spec.shape] if spec.shape is not None else [-1]


@dataclass
class ModelSignature:
    """What serving a model needs to know without running it: request validation, the protocol's model
    metadata and Triton's model config. A :class:`ModelInstance` has one; with ``--shared-models`` the
    decoding workers get only this from the model process (serve/model_host.py)."""

    config: ModelConfig
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batching: bool
    gpu: bool
    #: The input that also takes encoded images (BYTES, one JPEG/PNG per row; serve/images.py), or None.
    image: ImageInput | None = None

    def __post_init__(self) -> None:
        #: The runner's own check (feeds_check.py), here with fixed axes, per request.
        self.check = FeedCheck(self.inputs)

    @property
    def output_names(self) -> list[str]:
        """The model's output names, in order."""
        return [o.name for o in self.outputs]

    @property
    def max_batch(self) -> int:
        """The largest batch the batcher forms (0: the model does not batch)."""
        return self.config.max_batch if self.batching else 0

    def metadata(self) -> dict:
        """The protocol's model metadata (name, versions, platform, inputs and outputs)."""
        metadata = {
            "name": self.config.name, "versions": [VERSION], "platform": PLATFORM,
            "inputs": [{"name": s.name, "datatype": datatype_of(s.dtype), "shape": metadata_shape(s)}
                       for s in self.inputs],
            "outputs": [{"name": s.name, "datatype": datatype_of(s.dtype), "shape": metadata_shape(s)}
                        for s in self.outputs],
        }
        if self.image is not None:  # HTTP only: the gRPC ModelMetadataResponse has no parameters field
            metadata["parameters"] = {PARAMETER: self.image.to_dict()}
        return metadata

    def triton_config(self) -> dict:
        """Triton's model configuration as JSON (model_config.proto), for clients that read it."""
        drop = 1 if self.batching else 0  # Triton's dims leave out the batch axis when max_batch_size > 0

        def dims(spec: TensorSpec) -> list[int]:
            return metadata_shape(spec)[drop:]

        config = {
            "name": self.config.name, "platform": PLATFORM, "backend": "onnxruntime",
            "max_batch_size": self.max_batch,
            "input": [{"name": s.name, "data_type": "TYPE_" + _triton_type(s.dtype), "dims": dims(s)}
                      for s in self.inputs],
            "output": [{"name": s.name, "data_type": "TYPE_" + _triton_type(s.dtype), "dims": dims(s)}
                       for s in self.outputs],
            "instance_group": [{"name": self.config.name, "count": self.config.instances,
                                "kind": "KIND_GPU" if self.gpu else "KIND_CPU"}],
        }
        parameters = {}  # model_config.proto "parameters": map<string, ModelParameter{string_value}>
        if self.config.shape_buckets:
            parameters["shape_buckets"] = {"string_value": str(self.config.shape_buckets)}
        if self.image is not None:
            parameters[PARAMETER] = {"string_value": json.dumps(self.image.to_dict(), separators=(",", ":"))}
        if parameters:
            config["parameters"] = parameters
        if self.batching:
            config["dynamic_batching"] = {
                "max_queue_delay_microseconds": int(self.config.max_queue_delay_ms * 1000)}
        return config

    def validate(self, request: InferRequest) -> tuple[dict[str, np.ndarray], int]:
        """Check names, datatypes and shapes against the signature (the runner's rules, worded for the
        protocol); return the feeds and their row count."""
        found = self.check.problem(request.inputs, axes=True)
        if found is not None:
            raise bad_request(self._wording(found, request))
        rows = None
        feeds = {}
        for spec in self.inputs:
            value = request.inputs[spec.name]
            if self.batching:
                n = value.shape[0]
                if rows is not None and n != rows:
                    raise bad_request(f"The inputs of model '{self.config.name}' must share their first (batch) "
                                      f"axis; '{spec.name}' has {n} rows, another input {rows}.")
                rows = n
                if n > self.config.max_batch:
                    raise bad_request(f"Input '{spec.name}' has batch {n}, above the model's max_batch "
                                      f"{self.config.max_batch}; split the request.")
                if n == 0:
                    raise bad_request(f"Input '{spec.name}' has an empty batch axis.")
            feeds[spec.name] = _as_text(value, spec.name) if value.dtype == object else value
        if request.outputs:
            for out in request.outputs:
                if out.name not in self.output_names:
                    raise bad_request(f"Model '{self.config.name}' has no output named '{out.name}'; its outputs "
                                      f"are: {', '.join(self.output_names)}.")
        return feeds, rows or 1

    def _wording(self, found: FeedProblem, request: InferRequest) -> str:
        """The protocol's words for what the feed check found."""
        model, name = self.config.name, found.name
        if found.kind == "unknown":
            return f"Model '{model}' has no input named '{name}'; its inputs are: {', '.join(self.check.names)}."
        if found.kind == "missing":
            return f"The request has no value for input(s) {', '.join(found.names)} of model '{model}'."
        if found.kind == "dtype":
            spec_dtype = next(s.dtype for s in self.inputs if s.name == name)
            sent = request.datatypes.get(name, datatype_of(found.got))
            hint = ""
            if sent == "BYTES" and self.image is None and np.dtype(spec_dtype).kind == "f":
                hint = (" Encoded images are taken only when the image preset is known: serve with --preprocess "
                        "imagenet|yolo|scale01 (or a model config's \"preprocess\" key).")
            elif self.image is not None and self.image.layout == "uint8_nhwc" and name == self.image.name:
                hint = (f" Its {self.image.pre.preset} preprocessing runs in the graph: send uint8 pixels "
                        f"[N, {self.image.height}, {self.image.width}, 3] (RGB, resized and cropped) or one JPEG/PNG "
                        "per row as BYTES. To serve it taking float NCHW tensors, pass the model without embedded "
                        "preprocessing (on GPU targets with --preprocess: --embed-preprocess none).")
            return (f"Input '{name}' of model '{model}' is {datatype_of(spec_dtype)}; the request sends {sent}."
                    + hint)
        spec = next(s for s in self.inputs if s.name == name)
        if found.kind == "rank":
            return (f"Input '{name}' of model '{model}' has rank {found.want} {metadata_shape(spec)}; the request "
                    f"sends shape {list(found.got)}.")
        return (f"Input '{name}' of model '{model}' must have {found.want} on axis {found.axis} (shape "
                f"{metadata_shape(spec)}); the request sends shape {list(found.got)}.")

    def batch_key(self, feeds: Mapping[str, np.ndarray]) -> tuple:
        """Requests with equal keys can be joined along axis 0 (same trailing shapes)."""
        return tuple((name, value.shape[1:]) for name, value in feeds.items())


def _as_text(value: np.ndarray, name: str) -> np.ndarray:
    """BYTES elements as str: ONNX string tensors hold UTF-8 text, and onnxruntime turns a bytes object into
    its repr (b'...') rather than decoding it (seen with onnxruntime 1.32)."""
    try:
        return np.array([v.decode() if isinstance(v, bytes) else v for v in value.reshape(-1)],
                        dtype=object).reshape(value.shape)
    except UnicodeDecodeError as exc:
        raise bad_request(f"Input '{name}' is an ONNX string tensor, which holds UTF-8 text; element bytes are not "
                          f"UTF-8 ({exc.reason} at byte {exc.start}).") from None


def _triton_type(dtype: str) -> str:
    name = datatype_of(dtype)
    return "STRING" if name == "BYTES" else name
