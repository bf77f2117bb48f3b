"""Codec units: the vendored gRPC descriptor matches its .proto files and is wire-compatible with
tritonclient's generated messages; binary and JSON decoding/encoding round-trip."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from onnxaccel.serve import _descriptors
from onnxaccel.serve.grpc_messages import compile_descriptor_set, messages
from onnxaccel.serve.protocol import HEADER_LENGTH, InferRequest, RequestedOutput, decode_http_request, \
    encode_http_response


def test_embedded_descriptor_matches_the_proto_files():
    pytest.importorskip("grpc_tools")
    assert base64.b64decode(_descriptors.SERIALIZED) == compile_descriptor_set()


def test_messages_are_wire_compatible_with_tritonclient():
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    m = messages()
    theirs = service_pb2.ModelInferRequest(model_name="m", id="7")
    tensor = theirs.inputs.add(name="x", datatype="FP32", shape=[2])
    tensor.parameters["k"].int64_param = 3
    theirs.raw_input_contents.append(np.array([1, 2], np.float32).tobytes())
    ours = m.ModelInferRequest.FromString(theirs.SerializeToString())
    assert ours.model_name == "m" and ours.inputs[0].shape == [2] and ours.inputs[0].parameters["k"].int64_param == 3
    load = m.RepositoryModelLoadRequest.FromString(service_pb2.RepositoryModelLoadRequest(
        model_name="late").SerializeToString())
    assert load.triton_model_name == "late"  # Triton's field 2


def test_binary_request_and_response_round_trip():
    x = np.arange(6, dtype=np.float16).reshape(2, 3)
    head = json.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP16",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}]}).encode()
    request = decode_http_request("m", "", head + x.tobytes(), str(len(head)))
    assert np.array_equal(request.inputs["x"], x) and request.datatypes["x"] == "FP16"
    outputs = {"y": np.ones((2, 2), np.int64), "z": np.array([True, False])}
    body, headers = encode_http_response(request, "1", outputs)
    json_len = int(headers[HEADER_LENGTH])
    doc = json.loads(body[:json_len])
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == 32 and doc["outputs"][1]["data"] == [True, False]
    assert np.array_equal(np.frombuffer(body[json_len:], np.int64), np.ones(4))


def test_nested_json_data_is_accepted_and_response_is_json_by_default():
    request = decode_http_request("m", "", json.dumps({"inputs": [
        {"name": "x", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]}]}).encode(), None)
    assert request.inputs["x"].tolist() == [[1, 2], [3, 4]]
    body, headers = encode_http_response(InferRequest("m", outputs=[RequestedOutput("y")]), "1",
                                         {"y": np.zeros((1, 2), np.float32)})
    assert headers["Content-Type"] == "application/json" and json.loads(body)["outputs"][0]["data"] == [0.0, 0.0]
