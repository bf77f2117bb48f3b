"""The gRPC messages of the Open Inference Protocol, built at run time from a vendored descriptor set.

Generated ``*_pb2.py`` files pin the protobuf runtime they were generated for (since protobuf 5.26 generated
code calls ``runtime_version.ValidateProtobufRuntimeVersion`` and refuses a runtime older than its generator),
and onnx, tritonclient and kserve each pin protobuf differently. A serialized ``FileDescriptorSet`` has no such
pin: ``message_factory.GetMessageClass`` builds the classes on any protobuf >= 4.21.

``_descriptors.SERIALIZED`` is ``protoc --descriptor_set_out`` of ``proto/open_inference_grpc.proto`` (verbatim
from kserve/open-inference-protocol) and ``proto/triton_extensions.proto``, compiled with grpcio-tools 1.85.1.
Regenerate it after editing either file::

    python -m onnxaccel.serve.grpc_messages        # needs grpcio-tools

(tests/serve/test_grpc.py checks that the embedded bytes match the .proto files when grpcio-tools is present.)
"""

from __future__ import annotations

import base64
import functools
import sys
from pathlib import Path

from onnxaccel.errors import MissingDependencyError
from onnxaccel.serve._descriptors import SERIALIZED

PROTO_DIR = Path(__file__).parent / "proto"
PROTO_FILES = ("open_inference_grpc.proto", "triton_extensions.proto")
SERVICE = "inference.GRPCInferenceService"


class Messages:
    """Message classes by their proto name, e.g. ``messages().ModelInferRequest``."""

    def __init__(self, classes: dict[str, type]):
        self._classes = classes

    def __getattr__(self, name: str) -> type:
        try:
            return self._classes[name]
        except KeyError:
            raise AttributeError(name) from None


@functools.lru_cache(maxsize=1)
def messages() -> Messages:
    """The KServe v2 gRPC message classes, built from the descriptor at runtime (no generated code shipped)."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError as exc:  # protobuf comes with onnx, so this is unusual
        raise MissingDependencyError("protobuf", "serve", "The gRPC endpoint") from exc

    file_set = descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(SERIALIZED))
    # A private pool: the default pool may already hold tritonclient's or kserve's own `inference.*` types.
    pool = descriptor_pool.DescriptorPool()
    for file_proto in file_set.file:
        pool.Add(file_proto)
    classes = {}
    for file_proto in file_set.file:
        for msg in file_proto.message_type:
            classes[msg.name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inference.{msg.name}"))
    return Messages(classes)


#: ModelInferRequest's raw_input_contents: field 7, length-delimited (open_inference_grpc.proto).
_RAW_INPUT_TAG = (7 << 3) | 2


class InferRequestView:
    """A ModelInferRequest whose ``raw_input_contents`` are views of the bytes grpc received, not copies.

    upb copies each bytes field into its arena when it parses and again into a new bytes object at every read
    of the field, so large tensors were copied several times on the worker's event loop before they were even
    looked at (docs/SERVING.md, "gRPC"). The other fields (names, shapes, parameters: small) are parsed by the
    message class as usual; everything else reads through to that message."""

    __slots__ = ("message", "raw_input_contents")

    def __init__(self, message, raw_input_contents: list[memoryview]):
        self.message = message
        self.raw_input_contents = raw_input_contents

    def __getattr__(self, name: str):
        return getattr(self.message, name)


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def read_infer_request(data: bytes):
    """grpc's request deserializer for ModelInfer and ModelStreamInfer: an :class:`InferRequestView` whose raw
    contents are slices of ``data``. Top-level fields are walked by their wire format (varint tag, then a varint,
    8 bytes, a length-prefixed run or 4 bytes); any other wire type, or bytes that do not parse, go to the
    message class's own parser, which gives the same result or error as before."""
    cls = messages().ModelInferRequest
    view = memoryview(data)
    raw: list[memoryview] = []
    rest: list[memoryview] = []
    at, end = 0, len(view)
    try:
        while at < end:
            start = at
            tag, at = _varint(view, at)
            kind = tag & 7
            if kind == 0:
                _, at = _varint(view, at)
            elif kind == 1:
                at += 8
            elif kind == 5:
                at += 4
            elif kind == 2:
                length, at = _varint(view, at)
                if tag == _RAW_INPUT_TAG and at + length <= end:
                    raw.append(view[at:at + length])
                    at += length
                    continue
                at += length
            else:
                return cls.FromString(data)
            if at > end:
                return cls.FromString(data)
            rest.append(view[start:at])
    except (ValueError, IndexError):
        return cls.FromString(data)
    if not raw:
        return cls.FromString(data)
    return InferRequestView(cls.FromString(b"".join(rest)), raw)


def compile_descriptor_set() -> bytes:
    """Compile the vendored .proto files with grpcio-tools' bundled protoc; the serialized FileDescriptorSet."""
    import tempfile

    try:
        from grpc_tools import protoc
    except ImportError as exc:
        raise MissingDependencyError("grpcio-tools", "serve", "Regenerating the gRPC descriptor") from exc
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        code = protoc.main(["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", *PROTO_FILES])
        if code != 0:
            raise RuntimeError(f"protoc failed with exit status {code}")
        return out.read_bytes()


def _write_module(data: bytes) -> Path:
    text = base64.b64encode(data).decode()
    lines = [text[i:i + 100] for i in range(0, len(text), 100)]
    body = "\n".join(f'    "{line}"' for line in lines)
    path = Path(__file__).parent / "_descriptors.py"
    path.write_text(
        '"""Generated by `python -m onnxaccel.serve.grpc_messages` (grpcio-tools protoc); do not edit.\n\n'
        "Base64 of the FileDescriptorSet of proto/open_inference_grpc.proto and proto/triton_extensions.proto.\n"
        '"""\n\nSERIALIZED = (\n' + body + "\n)\n"
    )
    return path


if __name__ == "__main__":
    written = _write_module(compile_descriptor_set())
    sys.stdout.write(f"wrote {written}\n")
