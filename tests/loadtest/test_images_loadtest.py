"""`loadtest --images DIR` against a real server: the folder's files go as encoded images (BYTES), round robin,
over HTTP binary, HTTP JSON (base64) and gRPC; the report gives images/s."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import httpx
import onnx
import pytest

from onnxaccel.errors import UsageError
from onnxaccel.loadtest import LoadtestConfig, run_loadtest
from onnxaccel.loadtest.generator import make_image_inputs
from onnxaccel.model import load_model
from tests.serve.conftest import ServerProcess, write_config

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory, photo):
    """Two JPEGs and a PNG (scikit-image photographs), and a text file --images must skip."""
    folder = tmp_path_factory.mktemp("images")
    for name in ("chelsea.png", "coffee.png"):
        with Image.open(photo(name)) as img:
            buf = io.BytesIO()
            img.convert("RGB").save(buf, format="JPEG", quality=85)
        (folder / name.replace(".png", ".jpg")).write_bytes(buf.getvalue())
    (folder / "astronaut.png").write_bytes(photo("astronaut.png").read_bytes())
    (folder / "notes.txt").write_text("not an image")
    return folder


@pytest.fixture(scope="module")
def squeezenet_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lt_repo")
    (root / "squeezenet").mkdir()
    onnx.save(load_model("zoo:squeezenet").proto, root / "squeezenet" / "model.onnx")
    write_config(root / "squeezenet", max_batch=4, max_queue_delay_ms=1)
    proc = ServerProcess(root, log=tmp_path_factory.mktemp("logs") / "lt_images.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.log()


@pytest.mark.parametrize("protocol, binary", [("http", True), ("http", False), ("grpc", False)])
def test_loadtest_sends_the_folder_s_images(squeezenet_server, image_folder, protocol, binary):
    config = LoadtestConfig(url=squeezenet_server.url, model="squeezenet", protocol=protocol, binary=binary,
                            grpc_url=squeezenet_server.grpc_url, concurrency=(2,), duration_s=1.0, warmup_s=0.0,
                            batch=2, workers=1, max_requests=6, images=str(image_folder))
    before = _rows(squeezenet_server)
    report = run_loadtest(config)
    level = report.levels[0]
    assert level.errors == {}, level.error_samples
    assert level.requests == 6 and level.images
    assert level.to_dict()["images_per_s"] == pytest.approx(level.inferences_per_s) and level.inferences_per_s > 0
    assert report.input_shapes == {"data_0": [2]}
    assert _rows(squeezenet_server) - before == 12  # the server decoded and ran 2 images per request


def _rows(server) -> int:
    stats = httpx.get(f"{server.url}/v2/models/squeezenet/stats", timeout=10).json()
    return stats["model_stats"][0]["inference_count"]


def test_image_sets_go_round_robin_over_the_files(image_folder):
    metadata = {"name": "m", "inputs": [{"name": "other", "datatype": "FP32", "shape": [-1, 4]},
                                        {"name": "data_0", "datatype": "FP32", "shape": [-1, 3, 224, 224]}],
                "parameters": {"image_input": {"name": "data_0"}}}
    sets = make_image_inputs(metadata, str(image_folder), 2)
    files = sorted(p.read_bytes() for p in image_folder.iterdir() if p.suffix != ".txt")
    sent = [row for s in sets for row in s["data_0"]]
    assert len(sets) == 2 and sorted(sent[:3]) == files and sent[3] == sent[0]  # cycled to fill the last set
    with pytest.raises(UsageError, match="no image input"):
        make_image_inputs({"inputs": metadata["inputs"]}, str(image_folder), 1)
    with pytest.raises(UsageError, match="not a folder"):
        make_image_inputs(metadata, str(image_folder / "none"), 1)
    (image_folder.parent / "empty").mkdir(exist_ok=True)
    with pytest.raises(UsageError, match="no .jpg"):
        make_image_inputs(metadata, str(image_folder.parent / "empty"), 1)


def test_the_cli_reports_images_per_second(squeezenet_server, image_folder):
    done = subprocess.run([str(Path(sys.executable).parent / "onnxaccel"), "loadtest", squeezenet_server.url, "-m", "squeezenet",
                           "--images", str(image_folder), "--binary", "-c", "1", "-d", "1", "--warmup", "0",
                           "--max-requests", "3", "--workers", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "images/s" in done.stderr and "encoded images from" in done.stdout
