"""A model file's sha256 and onnx's checker verdict are kept while the file is unchanged (model_memo.py): a second
start reads neither again, and any change to the file or to an external data file it names works them out anew."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import pytest
from model_builders import make_mlp
from onnx import helper, numpy_helper

import onnxaccel.model as model_module
from onnxaccel import model_memo
from onnxaccel.errors import ModelFormatError
from onnxaccel.model import content_hash, load_model


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(tmp_path / "cache"))
    model_module._content_hash.cache_clear()
    yield tmp_path / "cache"
    model_module._content_hash.cache_clear()


@pytest.fixture()
def checks(monkeypatch):
    seen = []
    real = onnx.checker.check_model
    monkeypatch.setattr(onnx.checker, "check_model", lambda path, *a, **k: (seen.append(path), real(path, *a, **k)))
    return seen


def test_the_checker_runs_once_per_unchanged_file(cache, checks, tmp_path):
    path = make_mlp(tmp_path / "mlp.onnx")
    load_model(path)
    load_model(path)
    assert len(checks) == 1
    assert model_memo.facts(path)["checked"] == onnx.__version__
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # touched: checked again
    load_model(path)
    assert len(checks) == 2


def test_a_model_the_checker_refuses_is_refused_every_time(cache, checks, tmp_path):
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    bad = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node(
        "Relu", ["x"], ["y"])], "g", [x], [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]))
    path = tmp_path / "bad.onnx"
    onnx.save(bad, path)
    for _ in range(2):
        with pytest.raises(ModelFormatError):
            load_model(path)
    assert len(checks) == 2 and "checked" not in model_memo.facts(path)


def test_the_hash_is_kept_and_follows_external_data(cache, tmp_path):
    weight = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])], [weight])
    path = tmp_path / "ext" / "model.onnx"
    path.parent.mkdir()
    onnx.save(helper.make_model(graph), path, save_as_external_data=True, location="model.data",
              size_threshold=0)
    data = path.parent / "model.data"
    want = hashlib.sha256(path.read_bytes() + data.read_bytes()).hexdigest()
    assert content_hash(path) == want
    assert model_memo.facts(path)["sha256"] == want
    model_module._content_hash.cache_clear()  # a new process: the kept fact, without reading the files
    assert content_hash(path) == want
    data.write_bytes(b"\0" * data.stat().st_size)  # the weights change, the model file does not
    model_module._content_hash.cache_clear()
    assert model_memo.facts(path) == {}
    assert content_hash(path) == hashlib.sha256(path.read_bytes() + data.read_bytes()).hexdigest() != want


def test_an_unwritable_cache_only_costs_the_shortcut(tmp_path, monkeypatch, checks):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(blocker / "cache"))
    path = make_mlp(tmp_path / "mlp.onnx")
    load_model(path)
    load_model(path)
    assert len(checks) == 2 and model_memo.facts(path) == {}
