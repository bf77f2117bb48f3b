"""`onnxaccel loadtest --shape` binds as `run`, `bench` and `batch` do (issue 38, item 7): against a real server
serving a variable-width OCR-style model (input1 [batch, 1, 64, image_width]), the named-dimension form
``--shape image_width=192`` works, and the hint for an unbound width keeps the model's fixed dims."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper

from tests.loadtest.test_loadtest import run_loadtest
from tests.serve.conftest import ServerProcess


@pytest.fixture(scope="module")
def ocr_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ocr")
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["input1"], ["pooled"])], "ocr",
        [helper.make_tensor_value_info("input1", TensorProto.FLOAT, ["batch", 1, 64, "image_width"])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 1, 1, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "ocr.onnx")
    proc = ServerProcess(folder / "ocr.onnx", "--max-queue-delay-ms", "1", log=folder / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.log()


def loadtest(server, *args):
    return run_loadtest(server.url, "--model", "ocr", "-c", "1", "--duration", "0.3", "--warmup", "0",
                        "--workers", "1", *args)


def test_named_dimension_binds_the_free_width(ocr_server):
    done = loadtest(ocr_server, "--shape", "image_width=192", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["input_shapes"] == {"input1": [1, 1, 64, 192]}
    assert data["levels"][0]["requests"] > 0 and data["levels"][0]["error_count"] == 0
    done = loadtest(ocr_server, "--shape", "image_width=96", "--batch", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["input_shapes"] == {"input1": [2, 1, 64, 96]}


def test_unbound_width_suggests_the_model_s_own_fixed_dims(ocr_server):
    done = loadtest(ocr_server)
    text = " ".join(done.stderr.split())
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "input 'input1' axis 3" in text and "1x3x224x224" not in text
    assert f"onnxaccel loadtest {ocr_server.url} --model ocr --shape input1=1x1x64x" in text, text


def test_full_shape_is_checked_against_the_fixed_dims(ocr_server):
    done = loadtest(ocr_server, "--shape", "input1=1x3x224x224")
    text = " ".join(done.stderr.split())
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "axis 1 is fixed to 1" in text and "--shape input1=1x1x64x" in text, text
    done = loadtest(ocr_server, "--shape", "input1=1x1x64x128", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["input_shapes"] == {"input1": [1, 1, 64, 128]}
