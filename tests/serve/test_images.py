"""Encoded images over the wire (serve/images.py), on a real server on loopback with tritonclient: a JPEG sent as
BYTES equals the host-preprocessed float tensor of the same image; a model with embedded preprocessing takes
BYTES and uint8 pixels, both equal to the float path; bad bytes are a 400 naming the input and row."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import onnx
import pytest

from onnxaccel.inputs_files import ImagePreprocess, read_image, read_pixels
from onnxaccel.model import load_model
from onnxaccel.prepost.presets import preset_values
from onnxaccel.serve import images as serve_images
from onnxaccel.transform import embed_preprocess as embed_module
from onnxaccel.transform.embed_preprocess import embed_preprocess
from tests.serve.conftest import ServerProcess, write_config
from tritonclient.utils import InferenceServerException

tritonhttp = pytest.importorskip("tritonclient.http")
tritongrpc = pytest.importorskip("tritonclient.grpc")
Image = pytest.importorskip("PIL.Image")

PRE = ImagePreprocess(preset="imagenet", scale=preset_values("imagenet")[0])


def jpeg_of(path, quality: int = 90) -> bytes:
    """The photograph re-encoded as a JPEG with Pillow (what a client uploads)."""
    out = io.BytesIO()
    with Image.open(path) as img:
        img.convert("RGB").save(out, format="JPEG", quality=quality)
    return out.getvalue()


@pytest.fixture(scope="module")
def image_repo(tmp_path_factory):
    """squeezenet (zoo, float data_0[N,3,224,224], metadata preset imagenet), embedded (the same with imagenet
    preprocessing in the graph: uint8 [N,224,224,3]), cls (PP-OCR classifier: float, no preset in metadata)."""
    root = tmp_path_factory.mktemp("image_repo")
    model = load_model("zoo:squeezenet")
    for name in ("squeezenet", "embedded"):
        (root / name).mkdir()
        write_config(root / name, max_batch=4, max_queue_delay_ms=2)
    onnx.save(model.proto, root / "squeezenet" / "model.onnx")
    embedded, _ = embed_preprocess(model.proto, "imagenet")
    onnx.save(embedded, root / "embedded" / "model.onnx")
    return root


@pytest.fixture(scope="module")
def image_server(image_repo, tmp_path_factory):
    proc = ServerProcess(image_repo, log=tmp_path_factory.mktemp("logs") / "images.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.log()


@pytest.fixture(scope="module")
def jpegs(photo):
    return [jpeg_of(photo("chelsea.png")), jpeg_of(photo("coffee.png"))]


def host_float(jpeg: bytes) -> np.ndarray:
    """The host preprocessing of the same JPEG bytes (inputs_files.read_image): [1, 3, 224, 224] float32."""
    spec = load_model("zoo:squeezenet").inputs[0]
    return read_image(io.BytesIO(jpeg), spec, (1, 3, 224, 224), PRE)[0]


def bytes_array(blobs: list[bytes]) -> np.ndarray:
    value = np.empty(len(blobs), dtype=object)
    value[:] = blobs
    return value


def infer_http(server, model: str, name: str, value: np.ndarray, datatype: str) -> np.ndarray:
    client = tritonhttp.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    tensor = tritonhttp.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value, binary_data=True)
    result = client.infer(model, [tensor], outputs=[tritonhttp.InferRequestedOutput("softmaxout_1",
                                                                                     binary_data=True)])
    return result.as_numpy("softmaxout_1")


def infer_grpc(server, model: str, name: str, value: np.ndarray, datatype: str) -> np.ndarray:
    client = tritongrpc.InferenceServerClient(server.grpc_url)
    tensor = tritongrpc.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return client.infer(model, [tensor]).as_numpy("softmaxout_1")


@pytest.mark.parametrize("infer", [infer_http, infer_grpc], ids=["http-binary", "grpc"])
def test_jpeg_bytes_equal_the_host_preprocessed_float_tensor(image_server, jpegs, infer):
    floats = np.concatenate([host_float(j) for j in jpegs])
    want = infer(image_server, "squeezenet", "data_0", floats, "FP32")
    got = infer(image_server, "squeezenet", "data_0", bytes_array(jpegs), "BYTES")
    assert got.shape == want.shape == (2, 1000, 1, 1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)
    assert np.abs(got[0] - got[1]).max() > 1e-4  # two different photos: the equality above holds row by row


@pytest.mark.parametrize("infer", [infer_http, infer_grpc], ids=["http-binary", "grpc"])
def test_embedded_preprocessing_takes_bytes_and_uint8_equal_to_the_float_path(image_server, jpegs, infer):
    want = infer(image_server, "squeezenet", "data_0", np.concatenate([host_float(j) for j in jpegs]), "FP32")
    pixels = np.stack([read_pixels(io.BytesIO(j), 224, 224, PRE)[0] for j in jpegs])
    from_uint8 = infer(image_server, "embedded", "data_0", pixels, "UINT8")
    from_bytes = infer(image_server, "embedded", "data_0", bytes_array(jpegs), "BYTES")
    np.testing.assert_allclose(from_uint8, want, rtol=1e-4, atol=2e-4)
    np.testing.assert_allclose(from_bytes, want, rtol=1e-4, atol=2e-4)


def test_json_base64_bytes_and_a_png(image_server, photo):
    """BYTES in a JSON body, base64 with content_type base64 (serve/protocol.py); a PNG file as it is."""
    png = photo("chelsea.png").read_bytes()
    body = {"inputs": [{"name": "data_0", "shape": [1], "datatype": "BYTES",
                        "parameters": {"content_type": "base64"}, "data": [base64.b64encode(png).decode()]}]}
    reply = httpx.post(f"{image_server.url}/v2/models/squeezenet/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    out = np.asarray(reply.json()["outputs"][0]["data"], np.float32)
    spec = load_model("zoo:squeezenet").inputs[0]
    want = infer_http(image_server, "squeezenet", "data_0", read_image(photo("chelsea.png"), spec,
                                                                       (1, 3, 224, 224), PRE)[0], "FP32")
    np.testing.assert_allclose(out, want.reshape(-1), rtol=1e-4, atol=2e-4)


def test_corrupt_bytes_are_a_400_naming_the_input_and_row(image_server, jpegs):
    bad = jpegs[0][:200]  # a JPEG cut short
    client = tritonhttp.InferenceServerClient(f"127.0.0.1:{image_server.http_port}")
    tensor = tritonhttp.InferInput("data_0", [2], "BYTES")
    tensor.set_data_from_numpy(bytes_array([jpegs[0], bad]), binary_data=True)
    with pytest.raises(tritonhttp.InferenceServerException) as caught:
        client.infer("squeezenet", [tensor])
    assert caught.value.status() == "400"
    assert "Input 'data_0' row 1" in caught.value.message() and "not a readable image" in caught.value.message()
    grpc_client = tritongrpc.InferenceServerClient(image_server.grpc_url)
    tensor = tritongrpc.InferInput("data_0", [1], "BYTES")
    tensor.set_data_from_numpy(bytes_array([b"not an image at all"]))
    with pytest.raises(tritongrpc.InferenceServerException) as caught:
        grpc_client.infer("embedded", [tensor])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "Input 'data_0' row 0" in caught.value.message()
    # the server keeps serving
    assert infer_http(image_server, "squeezenet", "data_0", bytes_array(jpegs[:1]), "BYTES").shape == (1, 1000, 1, 1)


def test_metadata_and_config_advertise_the_image_input(image_server):
    meta = httpx.get(f"{image_server.url}/v2/models/squeezenet", timeout=10).json()
    image = meta["parameters"]["image_input"]
    assert image["name"] == "data_0" and image["datatype"] == "BYTES" and image["preset"] == "imagenet"
    assert image["decoded_to"] == {"datatype": "FP32", "shape": [-1, 3, 224, 224]}
    embedded = httpx.get(f"{image_server.url}/v2/models/embedded", timeout=10).json()["parameters"]["image_input"]
    assert embedded["embedded_preprocess"] and embedded["decoded_to"]["datatype"] == "UINT8"
    config = httpx.get(f"{image_server.url}/v2/models/squeezenet/config", timeout=10).json()
    assert json.loads(config["parameters"]["image_input"]["string_value"])["name"] == "data_0"
    grpc_config = tritongrpc.InferenceServerClient(image_server.grpc_url).get_model_config("squeezenet", as_json=True)
    assert grpc_config["config"]["max_batch_size"] == 4  # no parameters map in the gRPC message: left out there
    grpc_meta = tritongrpc.InferenceServerClient(image_server.grpc_url).get_model_metadata("squeezenet", as_json=True)
    assert grpc_meta["inputs"][0]["datatype"] == "FP32"  # gRPC metadata unchanged (no parameters field there)


def test_a_float_model_without_a_preset_refuses_bytes_with_a_hint(tmp_path, jpegs):
    """Metadata naming no preset: no image input (which normalization is unknown), and a BYTES request is a 400
    saying how to set one; ``preprocess`` (serve --preprocess, a config.json key) then turns it on."""
    from onnxaccel.serve.config import ModelConfig
    from onnxaccel.serve.images import image_input_of
    from onnxaccel.serve.protocol import InferRequest, ProtocolError
    from onnxaccel.serve.signature import ModelSignature

    proto = load_model("zoo:squeezenet").proto
    del proto.metadata_props[:]
    onnx.save(proto, tmp_path / "plain.onnx")
    model = load_model(tmp_path / "plain.onnx")
    assert image_input_of(model) is None
    image = image_input_of(model, "scale01")
    assert (image.name, image.height, image.width, image.layout, image.pre.preset) == \
        ("data_0", 224, 224, "float_nchw", "scale01")
    signature = ModelSignature(ModelConfig("plain", "x"), list(model.inputs), list(model.outputs), True, False)
    request = InferRequest("plain", inputs={"data_0": bytes_array(jpegs[:1])}, datatypes={"data_0": "BYTES"})
    with pytest.raises(ProtocolError) as caught:
        signature.validate(request)
    assert caught.value.status == 400 and "--preprocess imagenet|yolo|scale01" in caught.value.message


def test_the_embedded_metadata_key_is_the_transform_s():
    """serve may not import transform (scripts/check_imports.py), so the key is repeated: held equal here."""
    assert serve_images.META_EMBEDDED == embed_module.META_EMBEDDED


def test_decoding_workers_of_shared_models_take_images_with_the_serve_preprocess_option(tmp_path, jpegs):
    """--workers 2 --shared-models: the decoding workers decode (they hold only the signature); --preprocess gives
    the preset to a model whose metadata names none."""
    proto = load_model("zoo:squeezenet").proto
    del proto.metadata_props[:]
    (tmp_path / "repo" / "plain").mkdir(parents=True)
    onnx.save(proto, tmp_path / "repo" / "plain" / "model.onnx")
    proc = ServerProcess(tmp_path / "repo", "--workers", "2", "--shared-models", "--preprocess", "imagenet",
                         "--max-batch", "4", log=tmp_path / "shared.log")
    try:
        proc.wait_ready()
        want = infer_grpc(proc, "plain", "data_0", np.concatenate([host_float(j) for j in jpegs]), "FP32")
        for infer in (infer_http, infer_grpc):
            got = infer(proc, "plain", "data_0", bytes_array(jpegs), "BYTES")
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)
    finally:
        assert proc.stop() == 0, proc.log()


def test_a_float_tensor_to_an_embedded_model_is_a_400_naming_the_uint8_input(image_server, jpegs):
    # What `serve --preprocess imagenet` on a GPU target serves (serve/repository.py _served_model): clients who
    # still send float NCHW learn what the model takes now.
    floats = host_float(jpegs[0])
    with pytest.raises(InferenceServerException) as info:
        infer_http(image_server, "embedded", "data_0", floats, "FP32")
    text = str(info.value)
    assert "400" in text or "Bad Request" in text or "INVALID" in text.upper(), text
    assert "UINT8" in text.upper() and "[N, 224, 224, 3]" in text and "--embed-preprocess none" in text, text
