"""ModelInfer requests read with their raw tensor contents as views of the received bytes (grpc_messages.
read_infer_request): the same request as the message class parses, without the copies; the same error where
the bytes are not a request."""

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from onnxaccel.serve.grpc_messages import InferRequestView, messages, read_infer_request
from onnxaccel.serve.grpc_service import decode_grpc_request


def infer_request(*, raw_first: bool = False) -> tuple[bytes, dict[str, np.ndarray]]:
    """A serialized ModelInferRequest with two FP32/INT64 inputs in raw contents, parameters and outputs;
    with ``raw_first`` its raw contents come before the other fields (any order is valid protobuf)."""
    m = messages()
    arrays = {"x": np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5), "ids": np.array([[7], [9]], np.int64)}
    head = m.ModelInferRequest(model_name="mlp", model_version="1", id="req-42")
    head.parameters["priority"].int64_param = 3
    for name, value in arrays.items():
        tensor = head.inputs.add(name=name, datatype="FP32" if value.dtype == np.float32 else "INT64",
                                 shape=list(value.shape))
        tensor.parameters["note"].string_param = name
    head.outputs.add(name="y")
    raw = m.ModelInferRequest(raw_input_contents=[v.tobytes() for v in arrays.values()])
    parts = [raw.SerializeToString(), head.SerializeToString()]
    return b"".join(parts if raw_first else parts[::-1]), arrays


@pytest.mark.parametrize("raw_first", [False, True], ids=["fields-first", "raw-first"])
def test_raw_contents_are_views_of_the_received_bytes_and_the_rest_parses_as_before(raw_first):
    data, arrays = infer_request(raw_first=raw_first)
    expected = messages().ModelInferRequest.FromString(data)
    view = read_infer_request(data)
    assert isinstance(view, InferRequestView)
    assert all(isinstance(r, memoryview) and r.obj is data for r in view.raw_input_contents)  # no copy
    assert [bytes(r) for r in view.raw_input_contents] == list(expected.raw_input_contents)
    assert (view.model_name, view.model_version, view.id) == ("mlp", "1", "req-42")
    assert list(view.message.raw_input_contents) == []  # the parsed part holds no tensor bytes
    expected.ClearField("raw_input_contents")
    assert view.message == expected
    decoded = decode_grpc_request(view)
    for name, value in arrays.items():
        np.testing.assert_array_equal(decoded.inputs[name], value)
    assert decoded.parameters == {"priority": 3}
    assert [o.name for o in decoded.outputs] == ["y"]


def test_unknown_fields_of_every_wire_type_are_walked_over():
    data, arrays = infer_request()
    # Unknown fields 12 (varint 300), 13 (fixed64), 14 (fixed32) and 2047 (varint; a two-byte tag) first.
    extra = (bytes([12 << 3 | 0, 0xAC, 0x02]) + bytes([13 << 3 | 1]) + bytes(8) + bytes([14 << 3 | 5]) + bytes(4)
             + bytes([0xF8, 0x7F, 0x01]))
    data = extra + data
    view = read_infer_request(data)
    assert isinstance(view, InferRequestView)
    assert view.model_name == "mlp"
    np.testing.assert_array_equal(decode_grpc_request(view).inputs["x"], arrays["x"])


def test_a_request_without_raw_contents_is_the_message_itself():
    m = messages()
    request = m.ModelInferRequest(model_name="mlp")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    parsed = read_infer_request(request.SerializeToString())
    assert isinstance(parsed, m.ModelInferRequest) and parsed == request


@pytest.mark.parametrize("cut", [1, 7, -3])
def test_bytes_that_are_not_a_request_fail_as_the_message_class_fails(cut):
    data, _ = infer_request()
    broken = data[:cut]  # cut inside a tag, a length or a raw run
    with pytest.raises(DecodeError):
        messages().ModelInferRequest.FromString(broken)
    with pytest.raises(DecodeError):
        read_infer_request(broken)
