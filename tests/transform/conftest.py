"""Fixtures for the transform tests: the optimize/cache CLI on a local Typer app, real-ish image folders for
the pretrained classifier, a model whose FP16 conversion breaks, and an isolated compile cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import typer
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from text_images import write_folder

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="session")
def cli_app() -> typer.Typer:
    """`optimize` and `cache` registered the way cli/main.py will register them."""
    from onnxaccel.cli import cache, optimize

    app = typer.Typer(pretty_exceptions_enable=False)

    @app.callback()
    def root() -> None:  # a group, so `optimize` stays a subcommand
        pass

    optimize.register(app)
    cache.register(app)
    return app


@pytest.fixture
def invoke(cli_app):
    runner = CliRunner()

    def run(*args: str):
        result = runner.invoke(cli_app, [str(a) for a in args], env={"COLUMNS": "200"})
        assert "Traceback" not in result.output, result.output
        return result

    return run


@pytest.fixture
def compile_cache(tmp_path, monkeypatch) -> Path:
    """A fresh cache root for this test (zoo models are built before it is switched)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("ONNXACCEL_CACHE_DIR", str(root))
    return root


@pytest.fixture(scope="session")
def calibration_images(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("calibration"), 1000, 32)


@pytest.fixture(scope="session")
def eval_images(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("eval"), 0, 64)


@pytest.fixture(scope="session")
def overflow_path(tmp_path_factory) -> Path:
    """x[batch,16] -> MatMul -> Mul(1e5) -> Mul(1e-5) -> Relu -> MatMul -> logits[batch,8].

    In FP16 the constant 1e5 exceeds the largest finite half (65504) and is clamped, so `scale_up` computes
    x * 65504 instead of x * 1e5 and the logits come out about 35% too small; every other node is harmless
    in FP16.
    """
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32) * 0.5, "W"),
             numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32) * 0.3, "W2"),
             numpy_helper.from_array(np.array(1e5, np.float32), "up"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "down")]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
        helper.make_node("Mul", ["h", "up"], ["big"], name="scale_up"),
        helper.make_node("Mul", ["big", "down"], ["back"], name="scale_down"),
        helper.make_node("Relu", ["back"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W2"], ["logits"], name="head"),
    ]
    graph = helper.make_graph(nodes, "overflow",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 8])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    path = tmp_path_factory.mktemp("models") / "overflow.onnx"
    onnx.save(model, str(path))
    return path
