"""The Open Inference Protocol's tensors on HTTP: JSON tensors and the binary tensor data extension.

Facts from the protocol texts:
- JSON tensors: kserve/open-inference-protocol specification/protocol/inference_rest.md ("Tensor Data": the
  data is the flattened row-major elements, or the same nested as the shape; errors are ``{"error": msg}``).
- Binary tensors: Triton's extension (triton-inference-server/server docs/protocol/extension_binary_data.md):
  the header ``Inference-Header-Content-Length`` gives the length of the JSON part at the start of the body;
  each input whose data is binary carries ``parameters.binary_data_size`` and its bytes follow the JSON in input
  order; an output is returned binary when it asks ``parameters.binary_data: true`` or the request asks
  ``parameters.binary_data_output: true``; the response then carries the same header, and each binary output
  ``parameters.binary_data_size``. BYTES elements are 4-byte little-endian length prefixes + bytes.
Shapes and dtypes are checked against the model elsewhere (``signature.py``, with the runner's feed check); here only the request's own
consistency (element counts, byte sizes, datatypes) is checked.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"

#: Open Inference Protocol datatypes (inference_rest.md "Tensor Data Types") and their numpy types.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
_BY_NUMPY = {v.name: k for k, v in DATATYPES.items() if k != "BYTES"}


@functools.lru_cache(maxsize=512)
def datatype_of(dtype: np.dtype | str) -> str:
    """The protocol datatype for a numpy dtype (or dtype name); BYTES for strings. Cached: it is asked for
    every input and output of every request."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name in ("object", "str") or name.startswith(("str", "bytes")) or name == "string":
        return "BYTES"
    return _BY_NUMPY.get(name, name.upper())


class ProtocolError(Exception):
    """A request the server refuses: an HTTP status, the matching gRPC status name, and a message."""

    GRPC = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
            408: "DEADLINE_EXCEEDED", 413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED",
            503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED", 500: "INTERNAL"}

    def __init__(self, status: int, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after

    @property
    def grpc_code(self) -> str:
        """The gRPC status code matching this error's HTTP status."""
        return self.GRPC.get(self.status, "UNKNOWN")


def bad_request(message: str) -> ProtocolError:
    """A 400 ProtocolError with ``message``."""
    return ProtocolError(400, message)


@dataclass
class RequestedOutput:
    """An output a request asks for: whether it wants it as binary data, or where in shared memory it goes
    (``shm``: a shared_memory.TensorPlace; ``written``: the bytes it took there once written)."""
    name: str
    binary: bool | None = None  # None: the request-level default
    shm: object | None = None
    written: int = 0


@dataclass
class InferRequest:
    """A decoded inference request, the same for HTTP and gRPC."""

    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    #: The datatype each input was sent as (checked against the model later).
    datatypes: dict[str, str] = field(default_factory=dict)
    outputs: list[RequestedOutput] | None = None
    parameters: dict = field(default_factory=dict)

    @property
    def binary_output_default(self) -> bool:
        """Whether outputs come back as binary data unless an output says otherwise."""
        return bool(self.parameters.get("binary_data_output", False))

    @property
    def nbytes(self) -> int:
        """Bytes of every input tensor together."""
        return sum(a.nbytes for a in self.inputs.values())


# --- decoding ------------------------------------------------------------------------------------------

def decode_http_request(model_name: str, model_version: str, body: bytes | memoryview,
                        header_length: str | None, shm=None) -> InferRequest:
    """Parse an HTTP inference body: JSON, or JSON followed by binary tensors; with ``shm`` (the server's
    shared_memory.SharedMemoryRegistry), inputs read from and outputs placed in system shared memory."""
    view = memoryview(body)
    if header_length is not None:
        try:
            json_length = int(header_length)
        except ValueError:
            raise bad_request(f"{HEADER_LENGTH} must be an integer, got '{header_length}'.") from None
        if json_length < 0 or json_length > len(view):
            raise bad_request(f"{HEADER_LENGTH} is {json_length}, but the body has {len(view)} bytes.")
        head, binary = view[:json_length], view[json_length:]
    else:
        head, binary = view, view[:0]
    doc = parse_json(bytes(head))
    if not isinstance(doc, dict):
        raise bad_request("The request body must be a JSON object with an 'inputs' list.")
    request = InferRequest(model_name=model_name, model_version=model_version)
    request.id = _string(doc.get("id", ""), "id")
    request.parameters = _parameters(doc.get("parameters"), "the request")
    check_unsupported(request.parameters, "the request", offered=shm is not None)
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise bad_request("The request needs a non-empty 'inputs' list.")
    offset = 0
    for index, item in enumerate(inputs):
        name, datatype, shape, params = _tensor_header(item, f"inputs[{index}]")
        if name in request.inputs:
            raise bad_request(f"Input '{name}' appears twice in the request.")
        size = params.get("binary_data_size")
        if shm is not None and "shared_memory_region" in params and ("data" in item or size is not None):
            raise bad_request(f"Input '{name}' names shared memory region {params['shared_memory_region']!r} and "
                              f"also has {'data' if 'data' in item else 'binary_data_size'}; give its data once.")
        shared = shm_input(shm, params, datatype, shape, name)
        if shared is not None:
            request.inputs[name] = shared
        elif size is not None:
            if "data" in item:
                raise bad_request(f"Input '{name}' has both 'data' and parameters.binary_data_size.")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise bad_request(f"Input '{name}': binary_data_size must be a non-negative integer, got {size!r}.")
            if offset + size > len(binary):
                raise bad_request(
                    f"Input '{name}' declares binary_data_size {size} at offset {offset}, but the binary part of "
                    f"the body has only {len(binary)} bytes.")
            request.inputs[name] = from_bytes(binary[offset:offset + size], datatype, shape, name)
            offset += size
        else:
            if "data" not in item:
                raise bad_request(f"Input '{name}' has neither 'data' nor parameters.binary_data_size.")
            request.inputs[name] = from_json_data(item["data"], datatype, shape, name,
                                                  base64_elements=params.get("content_type") == "base64")
        request.datatypes[name] = datatype
    if offset != len(binary):
        raise bad_request(f"The body has {len(binary)} bytes of binary tensor data, but the inputs declare "
                          f"binary_data_size totalling {offset}.")
    request.outputs = _requested_outputs(doc.get("outputs"), shm)
    return request


def parse_json(text: bytes) -> object:
    """JSON text -> object; 400 when it is not JSON or nests too deep for the parser (RecursionError: 100,000
    nested '[' was a 500)."""
    try:
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}.") from None
    except RecursionError:
        raise bad_request("The request body's JSON nests too deep; tensor data is at most as deep as its shape "
                          "(flat lists are fine).") from None


#: Largest element count of one tensor: numpy refuses arrays whose byte size passes the address space
#: ("array is too big"), which was a 500; no tensor a request can carry comes near it.
MAX_ELEMENTS = 2**48


def check_shape(shape: tuple[int, ...], name: str) -> None:
    """400 for a shape whose element count (zero-sized dimensions counted as 1) overflows what an array may
    hold: [4611686018427387904, 0, 224, 224] has 0 elements but no array can take that shape."""
    count = 1
    for dim in shape:
        count *= max(dim, 1)
        if count > MAX_ELEMENTS:
            raise bad_request(f"Input '{name}' has shape {list(shape)}, whose dimensions multiply past "
                              f"{MAX_ELEMENTS} elements; no tensor of this server can be that large.")


def _tensor_header(item: object, where: str) -> tuple[str, str, tuple[int, ...], dict]:
    if not isinstance(item, dict):
        raise bad_request(f"{where} must be a JSON object with name, shape, datatype and data.")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request(f"{where} needs a 'name' string.")
    datatype = item.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise bad_request(f"Input '{name}' has datatype {datatype!r}; the protocol's datatypes are "
                          f"{', '.join(DATATYPES)}.")
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise bad_request(f"Input '{name}' needs a 'shape' list of non-negative integers, got {shape!r}.")
    check_shape(tuple(shape), name)
    params = _parameters(item.get("parameters"), f"input '{name}'")
    return name, datatype, tuple(shape), params


def check_output_parameters(params: Mapping, name: str, shm=None):
    """Where requested output ``name`` goes in shared memory (``shm.output_place``), or None; refuses what this
    server does not offer (HTTP and gRPC alike): shared memory without ``shm``, and the classification extension
    (``class_count``: tritonclient sends it as ``classification``)."""
    if "classification" in params:
        raise bad_request("The classification extension is not offered; ask for the raw output.")
    if shm is None:
        check_unsupported(params, f"output '{name}'")
        return None
    return shm.output_place(params, name)


def shm_input(shm, params: Mapping, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray | None:
    """Input ``name`` read from system shared memory when its parameters name a region (``shm.input_array``),
    else None; without ``shm`` (``--shared-memory none``) those parameters are refused."""
    if shm is None:
        check_unsupported(params, f"input '{name}'")
        return None
    return shm.input_array(params, datatype, shape, name)


def check_unsupported(params: Mapping, where: str, *, offered: bool = False) -> None:
    """Refuse the shared-memory extension's parameters, naming where they were given: not offered at all, or
    (``offered``) given on the request rather than on an input or output."""
    for key in ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset"):
        if key in params and offered:
            raise bad_request(f"{where} sets {key}; the shared-memory parameters belong on an input or a requested "
                              "output.")
        if key in params:
            raise bad_request(f"{where} uses the shared-memory extension ({key}), which this server does not "
                              "offer; send the data in the body (JSON or binary).")


def _parameters(value: object, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"'parameters' of {where} must be a JSON object.")
    return value


def _string(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise bad_request(f"'{what}' must be a string.")
    return value


def _requested_outputs(value: object, shm=None) -> list[RequestedOutput] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request("'outputs' must be a list of objects with a 'name'.")
    out, seen = [], set()
    for index, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise bad_request(f"outputs[{index}] needs a 'name' string.")
        if item["name"] in seen:  # each output comes back once, as over gRPC (one entry per name)
            continue
        seen.add(item["name"])
        params = _parameters(item.get("parameters"), f"output '{item['name']}'")
        place = check_output_parameters(params, item["name"], shm)
        binary = params.get("binary_data")
        if place is not None and binary:  # as Triton (http_server.cc ValidateOutputParameter)
            raise bad_request(f"Output '{item['name']}' asks for binary_data and names shared memory region "
                              f"'{place.region}'; it can come back only one way.")
        out.append(RequestedOutput(item["name"], None if binary is None else bool(binary), place))
    return out


def element_count(shape: tuple[int, ...]) -> int:
    """Number of elements of a tensor of ``shape`` (1 for a scalar)."""
    return math.prod(shape) if shape else 1


def from_bytes(raw: bytes | memoryview, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Raw row-major bytes of one tensor (binary extension, gRPC raw contents) -> array of ``shape``."""
    count = element_count(shape)
    if datatype == "BYTES":
        return _bytes_elements(raw, count, shape, name)
    dtype = DATATYPES[datatype]
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise bad_request(f"Input '{name}' is {datatype} of shape {list(shape)}: {expected} bytes expected, "
                          f"{len(raw)} given.")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _bytes_elements(raw: bytes | memoryview, count: int, shape: tuple[int, ...], name: str) -> np.ndarray:
    items, offset, data = [], 0, bytes(raw)
    while offset < len(data):
        if offset + 4 > len(data):
            raise bad_request(f"Input '{name}': a BYTES element length prefix is cut off at byte {offset}.")
        n = int.from_bytes(data[offset:offset + 4], "little")
        offset += 4
        if offset + n > len(data):
            raise bad_request(f"Input '{name}': a BYTES element of {n} bytes runs past the end of its data.")
        items.append(data[offset:offset + n])
        offset += n
    if len(items) != count:
        raise bad_request(f"Input '{name}' of shape {list(shape)} needs {count} BYTES elements, {len(items)} given.")
    return np.array(items, dtype=object).reshape(shape)


def from_json_data(data: object, datatype: str, shape: tuple[int, ...], name: str, *,
                   base64_elements: bool = False) -> np.ndarray:
    """JSON ``data`` (flat or nested as the shape) -> array of ``shape``, refusing lossy conversions.

    BYTES elements are UTF-8 strings, or base64 when the input says ``parameters.content_type: "base64"``
    (MLServer's convention for binary BYTES in JSON, mlserver/codecs/base64.py).
    """
    count = element_count(shape)
    if datatype == "BYTES":
        flat = _flatten(data, name)
        if not all(isinstance(v, str) for v in flat):
            raise bad_request(f"Input '{name}' is BYTES: its data must be strings.")
        arr = np.array([_b64(v, name, i) if base64_elements else v.encode() for i, v in enumerate(flat)],
                       dtype=object)
    else:
        dtype = DATATYPES[datatype]
        try:
            arr = np.asarray(data)
        except ValueError:
            raise bad_request(f"Input '{name}': 'data' is a ragged nested list; give it flat or as the shape.") \
                from None
        if arr.dtype.kind not in "biuf":
            raise bad_request(f"Input '{name}' is {datatype}: its data must be "
                              f"{'booleans' if dtype.kind == 'b' else 'numbers'}.")
        if dtype.kind in "iub" and arr.dtype.kind == "f":
            raise bad_request(f"Input '{name}' is {datatype}: its data holds non-integer numbers.")
        if dtype.kind == "b" and arr.dtype.kind != "b":
            raise bad_request(f"Input '{name}' is BOOL: its data must be true/false.")
        if dtype.kind in "iu" and arr.size:
            info = np.iinfo(dtype)
            if arr.min() < info.min or arr.max() > info.max:
                raise bad_request(f"Input '{name}' is {datatype}: a value is outside [{info.min}, {info.max}].")
        arr = arr.astype(dtype, copy=False).reshape(-1)
    if arr.size != count:
        raise bad_request(f"Input '{name}' has shape {list(shape)} ({count} elements), but 'data' holds "
                          f"{arr.size} values.")
    return arr.reshape(shape)


def _b64(text: str, name: str, index: int) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"Input '{name}' element {index} is not valid base64 (content_type base64).") from None


def _flatten(data: object, name: str) -> list:
    if not isinstance(data, list):
        raise bad_request(f"Input '{name}': 'data' must be a list.")
    out: list = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


# --- encoding ------------------------------------------------------------------------------------------

def to_bytes(array: np.ndarray) -> bytes:
    """Row-major raw bytes of a tensor (BYTES: length-prefixed elements)."""
    if array.dtype == object or array.dtype.kind in "SU":
        parts = []
        for item in array.reshape(-1):
            value = item if isinstance(item, bytes) else str(item).encode()
            parts.append(len(value).to_bytes(4, "little") + value)
        return b"".join(parts)
    return np.ascontiguousarray(array).tobytes()


def encode_http_response(request: InferRequest, model_version: str, outputs: Mapping[str, np.ndarray],
                         ) -> tuple[bytes, dict[str, str]]:
    """The response body and headers: JSON, or JSON + binary outputs when any output is asked binary."""
    names = [o.name for o in request.outputs] if request.outputs else list(outputs)
    binary_flag = {o.name: o.binary for o in request.outputs or []}
    shared = {o.name: o for o in request.outputs or [] if o.shm is not None}
    default = request.binary_output_default
    doc: dict = {"model_name": request.model_name, "model_version": model_version}
    if request.id:
        doc["id"] = request.id
    entries, blobs = [], []
    for name in names:
        value = outputs[name]
        entry: dict = {"name": name, "datatype": datatype_of(value.dtype), "shape": list(value.shape)}
        binary = binary_flag.get(name)
        if name in shared:
            # In the client's shared memory already: name, datatype and shape only, no "parameters", as Triton's
            # HTTP front end answers (triton-inference-server/server src/http_server.cc @ 00a165a65e77,
            # InferRequestClass::FinalizeResponse: only binary outputs get parameters). Triton's C++ client
            # (perf_analyzer) reads binary_data_size from every output that has parameters and fails
            # otherwise (triton-inference-server/client src/c++/library/http_client.cc @ 01b9a35fd4ec).
            pass
        elif binary if binary is not None else default:
            blob = to_bytes(value)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif value.dtype == object:
            entry["data"] = [v.decode(errors="replace") if isinstance(v, bytes) else str(v)
                             for v in value.reshape(-1)]
        else:
            entry["data"] = value.reshape(-1).tolist()
        entries.append(entry)
    doc["outputs"] = entries
    head = json.dumps(doc, separators=(",", ":"), allow_nan=True).encode()
    if not blobs:
        return head, {"Content-Type": "application/json"}
    return b"".join([head, *blobs]), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}
