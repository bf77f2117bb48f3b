"""Real pretrained models with dynamic axes served with no --shape by a real `onnxaccel serve` on loopback,
queried by tritonclient: PP-OCR det (height and width dynamic), PP-OCR rec (width dynamic), Silero VAD (sample
axis dynamic, plus a state and a scalar sample rate) and BERT (sequence dynamic) with --shape-buckets under
concurrent mixed-length requests. Every answer equals the unpadded in-process ONNX Runtime run."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from onnxaccel.model import load_model
from tests.serve.conftest import ServerProcess

tritonhttp = pytest.importorskip("tritonclient.http")
tritongrpc = pytest.importorskip("tritonclient.grpc")

BUCKETS = "sequence=16,32,64"


def reference(path, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def http_infer(server: ServerProcess, model: str, feeds: dict, datatypes: dict | None = None):
    client = tritonhttp.InferenceServerClient(server.url.removeprefix("http://"))
    inputs = []
    for name, value in feeds.items():
        inp = tritonhttp.InferInput(name, list(value.shape), (datatypes or {}).get(name, "FP32"))
        inp.set_data_from_numpy(value, binary_data=True)
        inputs.append(inp)
    return client.infer(model, inputs)


@pytest.fixture(scope="module")
def dynamic_repo(tmp_path_factory, pretrained_det, pretrained_rec, silero_vad_model) -> Path:
    root = tmp_path_factory.mktemp("dynamic")
    for name, path in (("det", pretrained_det), ("rec", pretrained_rec), ("vad", silero_vad_model)):
        (root / name).mkdir()
        (root / name / "model.onnx").write_bytes(Path(path).read_bytes())
    (root / "rec" / "config.json").write_text(json.dumps({"max_batch": 4, "max_queue_delay_ms": 20}))
    return root


@pytest.fixture(scope="module")
def dynamic_server(dynamic_repo, tmp_path_factory):
    """The repository of det, rec and vad, served with no --shape (det was UNAVAILABLE before: its height and
    width are named symbolic dims with no default)."""
    proc = ServerProcess(dynamic_repo, log=tmp_path_factory.mktemp("logs") / "dynamic.log")
    try:
        yield proc.wait_ready(120)
    finally:
        assert proc.stop() == 0, proc.log()


@pytest.fixture(scope="module")
def bert_server(tmp_path_factory):
    """zoo:bert-tiny with sequence buckets 16/32/64, batching up to 8 requests for 50 ms."""
    proc = ServerProcess("zoo:bert-tiny", "--shape-buckets", BUCKETS, "--max-batch", "8", "--max-queue-delay-ms",
                         "50", log=tmp_path_factory.mktemp("logs") / "bert.log")
    try:
        yield proc.wait_ready(120)
    finally:
        assert proc.stop() == 0, proc.log()


def test_every_dynamic_model_is_ready(dynamic_server):
    index = httpx.post(f"{dynamic_server.url}/v2/repository/index", timeout=10).json()
    assert {m["name"]: m["state"] for m in index} == {"det": "READY", "rec": "READY", "vad": "READY"}, index


def test_det_serves_two_image_sizes(dynamic_server, pretrained_det):
    meta = httpx.get(f"{dynamic_server.url}/v2/models/det", timeout=10).json()
    assert meta["inputs"][0]["shape"] == [-1, 3, -1, -1]
    rng = np.random.default_rng(3)
    for shape in ((1, 3, 64, 96), (1, 3, 128, 160)):
        x = rng.random(shape, dtype=np.float32)
        got = http_infer(dynamic_server, "det", {"x": x}).as_numpy(meta["outputs"][0]["name"])
        want = reference(pretrained_det, {"x": x})[0]
        assert got.shape == want.shape == (1, 1, *shape[2:])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_rec_concurrent_widths_over_grpc(dynamic_server, pretrained_rec):
    rng = np.random.default_rng(5)
    images = [rng.random((1, 3, 48, w), dtype=np.float32) for w in (80, 160, 80, 320, 160)]
    client = tritongrpc.InferenceServerClient(dynamic_server.grpc_url)
    out = client.get_model_metadata("rec", as_json=True)["outputs"][0]["name"]

    def infer(x):
        inp = tritongrpc.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer("rec", [inp]).as_numpy(out)

    with ThreadPoolExecutor(len(images)) as pool:
        answers = list(pool.map(infer, images))
    for x, got in zip(images, answers):
        np.testing.assert_allclose(got, reference(pretrained_rec, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_silero_vad_chunks_of_two_lengths(dynamic_server, silero_vad_model):
    """Silero VAD 6 takes one chunk per call: 512 samples at 16 kHz (256 at 8 kHz) after the 64 (32) samples of
    context its Python wrapper prepends (silero_vad/utils_vad.py OnnxWrapper), and a scalar sample rate."""
    rng = np.random.default_rng(9)
    state = np.zeros((2, 1, 128), np.float32)
    for samples, rate in ((576, 16000), (288, 8000)):
        audio = (rng.standard_normal((1, samples)) * 0.1).astype(np.float32)
        feeds = {"input": audio, "state": state, "sr": np.array(rate, np.int64)}
        result = http_infer(dynamic_server, "vad", feeds, {"sr": "INT64"})
        want = reference(silero_vad_model, feeds)
        np.testing.assert_allclose(result.as_numpy("output"), want[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(result.as_numpy("stateN"), want[1], rtol=1e-4, atol=1e-5)


def bert_feeds(length: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 5000, (1, length), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def test_bert_buckets_mixed_lengths_concurrent(bert_server):
    path = load_model("zoo:bert-tiny").path
    lengths = [5, 16, 20, 40, 64, 7, 33, 12, 50, 3]
    requests = [bert_feeds(n, i) for i, n in enumerate(lengths)]
    types = {"input_ids": "INT64", "attention_mask": "INT64", "token_type_ids": "INT64"}
    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(lambda f: http_infer(bert_server, "bert-tiny", f, types), requests))
    for feeds, result in zip(requests, results):
        hidden, pooled = reference(path, feeds)
        got = result.as_numpy("last_hidden_state")
        assert got.shape == hidden.shape  # cropped back from its bucket
        np.testing.assert_allclose(got, hidden, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(result.as_numpy("pooler_output"), pooled, rtol=1e-3, atol=1e-4)
    stats = httpx.get(f"{bert_server.url}/v2/models/bert-tiny/stats", timeout=10).json()
    model_stats = stats["model_stats"][0]
    # Requests of one bucket were joined: fewer runs than requests.
    assert model_stats["execution_count"] < model_stats["inference_count"] == len(lengths), model_stats


def test_bert_metadata_reports_dynamic_dims_and_buckets(bert_server):
    meta = httpx.get(f"{bert_server.url}/v2/models/bert-tiny", timeout=10).json()
    assert [i["shape"] for i in meta["inputs"]] == [[-1, -1]] * 3
    config = httpx.get(f"{bert_server.url}/v2/models/bert-tiny/config", timeout=10).json()
    assert config["input"][0]["dims"] == [-1]
    assert config["parameters"]["shape_buckets"]["string_value"] == BUCKETS


def test_bert_too_long_is_400_naming_the_buckets(bert_server):
    feeds = bert_feeds(65, 1)
    body = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": "INT64", "data": v.reshape(-1).tolist()}
                       for k, v in feeds.items()]}
    response = httpx.post(f"{bert_server.url}/v2/models/bert-tiny/infer", json=body, timeout=10)
    assert response.status_code == 400, response.text
    assert BUCKETS in response.json()["error"] and "sequence=65" in response.json()["error"]
    client = tritongrpc.InferenceServerClient(bert_server.grpc_url)
    inputs = []
    for name, value in feeds.items():
        inp = tritongrpc.InferInput(name, list(value.shape), "INT64")
        inp.set_data_from_numpy(value)
        inputs.append(inp)
    with pytest.raises(tritongrpc.InferenceServerException) as err:
        client.infer("bert-tiny", inputs)
    assert "INVALID_ARGUMENT" in str(err.value.status()) and BUCKETS in err.value.message()


def test_yolo_detector_served_without_shape_finds_the_astronaut(yolo_model, photo, tmp_path):
    """The YOLOv8 detector (Ultralytics export, shipped in a PyPI package) served with no --shape: its answer to
    a letterboxed photograph equals the in-process run, and decodes to the one person in it."""
    from onnxaccel.inputs_files import ImagePreprocess, read_image
    from onnxaccel.prepost.detect import decode_yolov8

    model = load_model(yolo_model)
    pre = ImagePreprocess(preset="yolo", scale=1 / 255.0, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    image, info = read_image(photo("astronaut.png"), model.inputs[0], (1, 3, 640, 640), pre)
    proc = ServerProcess(yolo_model, log=tmp_path / "yolo.log")
    try:
        server = proc.wait_ready(120)
        answer = http_infer(server, "best_fp16", {"images": image}).as_numpy("output0")
    finally:
        assert proc.stop() == 0, proc.log()
    np.testing.assert_allclose(answer, reference(yolo_model, {"images": image})[0], rtol=1e-4, atol=1e-3)
    [found] = decode_yolov8(answer, conf=0.3, names={0: "Normal", 1: "Fall"}, letterbox=info.letterbox)
    assert [d.label for d in found] == ["Normal"] and found[0].score > 0.5
