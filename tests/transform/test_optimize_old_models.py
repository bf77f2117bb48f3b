"""`onnxaccel optimize` on older but valid models (IR 3): the model zoo's `light` models and a
pytorch-converted model, both shipped in the onnx wheel (issue 38, item 10).

Before IR 4 every initializer must also be a graph input. ONNX Runtime's saved optimized graph breaks that
rule (new initializers from constant folding are not inputs; folded-away ones stay as value-less inputs), and
`optimize` used to run the checker on that graph: the default run, the FP16 run ("fails onnx.checker before
any conversion", naming ORT's nodes) and the compile cache all failed although the input passes the checker.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
#: The three smallest of the nine light models (each optimizes in about a second or two).
LIGHT = ("light_squeezenet", "light_shufflenet", "light_inception_v1")


def _light(name: str) -> Path:
    path = DATA / "light" / f"{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not in this onnx wheel")
    return path


def _outputs(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def _feeds(path: Path) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in session.get_inputs()}


@pytest.mark.parametrize("name", LIGHT)
def test_light_models_optimize_with_the_defaults(invoke, compile_cache, tmp_path, name):
    source = _light(name)
    onnx.checker.check_model(onnx.load(str(source)), full_check=True)  # the input is valid
    out = tmp_path / "out.onnx"
    result = invoke("optimize", source, "-o", out, "-t", "cpu")
    assert result.exit_code == 0, result.output
    assert "fails onnx.checker" not in result.output
    written = onnx.load(str(out))
    onnx.checker.check_model(written, full_check=True)
    feeds = _feeds(source)
    assert set(feeds) == {i.name for i in _input_names(out)}  # no value-less leftover inputs
    for want, got in zip(_outputs(source, feeds), _outputs(out, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)

    from onnxaccel.model import load_model

    assert load_model(str(out)).path  # reloads in onnxaccel (with its own checks)


def _input_names(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()


def test_fp16_of_a_light_model_is_not_blamed_on_the_input(invoke, tmp_path):
    out = tmp_path / "out.onnx"
    result = invoke("optimize", _light("light_squeezenet"), "-o", out, "-t", "cpu", "--fp16", "--no-compile-cache")
    assert result.exit_code == 0, result.output
    assert "before any conversion" not in result.output
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)


def test_pytorch_converted_model_fills_the_compile_cache(invoke, compile_cache, tmp_path):
    source = DATA / "pytorch-converted" / "test_Conv2d" / "model.onnx"
    if not source.exists():
        pytest.skip(f"{source} is not in this onnx wheel")
    out = tmp_path / "out.onnx"
    result = invoke("optimize", source, "-o", out, "-t", "cpu")
    assert result.exit_code == 0, result.output
    assert "compile cache produced" not in result.output
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)


def test_conform_inputs_leaves_ir4_models_alone():
    from onnx import TensorProto, helper

    from onnxaccel.transform.graph import conform_inputs

    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])])
    model = helper.make_model(graph, ir_version=7, opset_imports=[helper.make_opsetid("", 13)])
    assert [i.name for i in conform_inputs(model, model).graph.input] == ["x"]
    model.ir_version = 3
    model.opset_import[0].version = 8
    assert [i.name for i in conform_inputs(model, model).graph.input] == ["x", "w"]
    onnx.checker.check_model(model, full_check=True)


def test_an_invalid_ort_graph_is_blamed_on_the_graph_step_not_the_input(invoke, tmp_path, monkeypatch):
    """Without the IR fix, ORT's graph fails the checker: that is our graph step's fault, never the input's."""
    from onnxaccel.transform import graph

    monkeypatch.setattr(graph, "conform_inputs", lambda source, optimized: optimized)
    result = invoke("optimize", _light("light_squeezenet"), "-o", tmp_path / "o.onnx", "-t", "cpu", "--fp16",
                    "--no-compile-cache")
    assert result.exit_code != 0
    assert "before any conversion" not in result.output
    assert "optimize (graph) produced a model that fails onnx.checker" in " ".join(result.output.split())
