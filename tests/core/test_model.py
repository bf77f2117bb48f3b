"""Model: loading, validation errors, signature, shape binding, IR compatibility."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from model_builders import make_mlp
from onnxaccel import load_model
from onnxaccel.engines import compile_model
from onnxaccel.engines.ort import runtime_limits
from onnxaccel.errors import ModelFormatError, ModelNotFoundError, ModelVersionError, ShapeError
from onnxaccel.model import parse_shape_bindings
from onnxaccel.target import parse_target


def test_signature_reads_names_dtypes_and_symbolic_dims(mlp_path):
    model = load_model(mlp_path)
    assert [(s.name, s.dtype, s.shape) for s in model.inputs] == [("x", "float32", ("batch", 4))]
    assert model.outputs[0].shape == ("batch", 3)
    assert model.opsets == {"ai.onnx": 17}


def test_missing_file_names_it_and_suggests_the_zoo(tmp_path):
    with pytest.raises(ModelNotFoundError) as err:
        load_model("resnet50")
    assert "not found: resnet50" in err.value.message
    assert "zoo:resnet50" in err.value.hint


def test_directory_is_rejected_with_a_hint(tmp_path):
    with pytest.raises(ModelNotFoundError, match="is a directory"):
        load_model(tmp_path)


@pytest.mark.parametrize("content", [b"", b"this is plainly not a protobuf \xff\xfe", b"\x08\x07"])
def test_non_onnx_bytes_are_a_format_error(tmp_path, content):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelFormatError) as err:
        load_model(path)
    assert "is not an ONNX model" in err.value.message
    assert err.value.hint


def test_truncated_model_is_a_format_error(tmp_path, mlp_path):
    data = mlp_path.read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError):
        load_model(path)


def test_invalid_graph_is_reported_with_the_checker_message(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["nowhere"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "invalid.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelFormatError) as err:
        load_model(path)
    assert "not a valid ONNX graph" in err.value.message and "nowhere" in err.value.message
    assert load_model(path, check=False).inputs[0].name == "x"


def test_external_data_model_loads_and_runs(tmp_path, mlp_path):
    proto = onnx.load(str(mlp_path))
    path = tmp_path / "ext" / "model.onnx"
    path.parent.mkdir()
    onnx.save(proto, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    assert (path.parent / "weights.bin").exists()
    model = load_model(path).bind(batch=2)
    runner = compile_model(model, parse_target("cpu"))
    out = runner.run({"x": np.ones((2, 4), np.float32)})["probs"]
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)


def test_missing_external_data_file_is_named(tmp_path, mlp_path):
    proto = onnx.load(str(mlp_path))
    path = tmp_path / "model.onnx"
    onnx.save(proto, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ModelFormatError) as err:
        load_model(path)
    assert "weights.bin" in err.value.message and "beside" in err.value.hint


def test_ir_newer_than_runtime_is_lowered_when_safe_and_runs(tmp_path):
    max_ir, _ = runtime_limits()
    path = make_mlp(tmp_path / "new_ir.onnx", ir_version=max_ir + 1, opset=17)
    model = load_model(path, check=False)
    runner = compile_model(model.bind(batch=1), parse_target("cpu"))
    assert runner.model.ir_version == max_ir
    assert any(f"IR version {max_ir + 1}" in w and f"IR {max_ir}" in w for w in runner.warnings)
    assert runner.run({"x": np.ones((1, 4), np.float32)})["probs"].shape == (1, 3)


def test_opset_newer_than_runtime_names_both_versions(tmp_path):
    _, max_opset = runtime_limits()
    model = load_model(make_mlp(tmp_path / "new_opset.onnx", opset=max_opset + 1), check=False)
    with pytest.raises(ModelVersionError) as err:
        model.for_runtime(99, max_opset, "onnxruntime X")
    assert f"opset {max_opset + 1}" in err.value.message and f"up to opset {max_opset}" in err.value.message
    assert "convert_version" in err.value.hint


def test_lowering_ir_is_refused_when_the_opset_needs_the_newer_ir(tmp_path):
    model = load_model(make_mlp(tmp_path / "m.onnx", ir_version=10, opset=21), check=False)
    with pytest.raises(ModelVersionError, match="not safe"):
        model.for_runtime(7, 21, "onnxruntime X")


def test_runtime_limits_come_from_the_runtime_itself():
    import onnxruntime as ort

    max_ir, max_opset = runtime_limits()
    assert 10 <= max_ir <= onnx.IR_VERSION + 1 and 20 <= max_opset <= 40
    assert ort.__version__  # the limits are per installed version; the probe ran against it


def test_bind_by_input_name_and_by_dim_param(mlp_path):
    model = load_model(mlp_path)
    assert model.bind({"x": (5, 4)}).input_shapes == {"x": (5, 4)}
    assert model.bind({"batch": (3,)}).input_shapes == {"x": (3, 4)}
    assert model.bind(batch=7).input_shapes == {"x": (7, 4)}


def test_unbound_batch_defaults_to_one_with_a_note(mlp_path):
    bound = load_model(mlp_path).bind()
    assert bound.input_shapes == {"x": (1, 4)}
    assert any("--batch" in n for n in bound.notes)


def test_binding_errors_are_precise(mlp_path):
    model = load_model(mlp_path)
    with pytest.raises(ShapeError, match="rank 2"):
        model.bind({"x": (1, 4, 1)})
    with pytest.raises(ShapeError, match="axis 1 is fixed to 4"):
        model.bind({"x": (1, 5)})
    with pytest.raises(ShapeError, match="neither an input nor a symbolic dimension"):
        model.bind({"y": (1,)})
    with pytest.raises(ShapeError, match="at least 1"):
        model.bind(batch=0)


def test_unbound_non_batch_dim_is_named(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["ids"], ["y"])], "g",
        [helper.make_tensor_value_info("ids", TensorProto.FLOAT, ["batch", "sequence"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence"])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "seq.onnx"))
    model = load_model(tmp_path / "seq.onnx")
    with pytest.raises(ShapeError) as err:
        model.bind(batch=2)
    assert "input 'ids' axis 1 ('sequence')" in err.value.message
    assert "--shape" in err.value.hint
    assert model.bind({"sequence": (16,)}, batch=2).input_shapes == {"ids": (2, 16)}


def test_shared_dim_param_conflict_is_an_error(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "n"]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "add.onnx"))
    model = load_model(tmp_path / "add.onnx")
    assert model.bind({"a": (2, 3)}).input_shapes == {"a": (2, 3), "b": (2, 3)}
    with pytest.raises(ShapeError, match="'n' is bound to 3 elsewhere but to 5"):
        model.bind({"a": (2, 3), "b": (2, 5)})


def test_unknown_dims_from_exporters_are_not_shared_names(pretrained_cls):
    # The PP-OCR classifier declares x as [-1, 3, '?', '?']: '?' on two axes is not one shared dimension.
    model = load_model(pretrained_cls)
    assert model.inputs[0].shape == (None, 3, None, None)
    assert model.bind({"x": (2, 3, 48, 192)}).input_shapes == {"x": (2, 3, 48, 192)}
    with pytest.raises(ShapeError, match="axis 2 \\(unnamed\\)"):
        model.bind()


@pytest.mark.parametrize("text,expected", [
    (["x=1x3x224x224"], {"x": (1, 3, 224, 224)}),
    (["x=1,3"], {"x": (1, 3)}),
    (["a/b:0=2x2", "sequence=128"], {"a/b:0": (2, 2), "sequence": (128,)}),
])
def test_parse_shape_bindings(text, expected):
    assert parse_shape_bindings(text) == expected


@pytest.mark.parametrize("bad", ["x", "x=", "=1x2", "x=1xa", "x=1x-2"])
def test_parse_shape_bindings_rejects_malformed(bad):
    with pytest.raises(ShapeError, match="Cannot read the shape binding"):
        parse_shape_bindings([bad])
