"""The shape resolution order (model_shapes.py, docs/SHAPES.md): metadata imgsz, the unbound-dim error."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from onnxaccel.errors import ShapeError
from onnxaccel.model import load_model


def _dynamic_yolo(yolo_model, tmp_path, imgsz: str | None = "[640, 640]"):
    """The Ultralytics export with the dynamic axes of ``export(dynamic=True)``: batch, height, width."""
    proto = onnx.load(str(yolo_model))
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    for axis, name in ((0, "batch"), (2, "height"), (3, "width")):
        dims[axis].Clear()
        dims[axis].dim_param = name
    for prop in proto.metadata_props:
        if prop.key == "imgsz" and imgsz is not None:
            prop.value = imgsz
    if imgsz is None:
        kept = [p for p in proto.metadata_props if p.key != "imgsz"]
        del proto.metadata_props[:]
        proto.metadata_props.extend(kept)
    path = tmp_path / "yolo_dynamic.onnx"
    onnx.save(proto, str(path))
    return load_model(path, check=False)


def test_ultralytics_imgsz_binds_height_and_width(yolo_model, tmp_path):
    model = _dynamic_yolo(yolo_model, tmp_path, "[320, 480]")
    assert model.inputs[0].shape == ("batch", 3, "height", "width")
    bound = model.bind()
    assert bound.input_shapes == {"images": (1, 3, 320, 480)}
    assert any("imgsz" in n for n in bound.notes)
    # --shape comes first in the order
    assert model.bind({"height": (640,)}).input_shapes == {"images": (1, 3, 640, 480)}


def test_without_imgsz_the_error_names_each_dim_and_a_command(yolo_model, tmp_path):
    model = _dynamic_yolo(yolo_model, tmp_path, None)
    with pytest.raises(ShapeError) as err:
        model.bind()
    assert "input 'images' axis 2 ('height'); input 'images' axis 3 ('width')" in err.value.message
    assert f"onnxaccel run {model.source} --shape height=640 --shape width=640" in err.value.hint


def test_generated_dim_names_are_bound_by_the_full_shape(pretrained_det):
    model = load_model(pretrained_det, check=False)
    with pytest.raises(ShapeError) as err:
        model.bind()
    assert "input 'x' axis 2 ('p2o.DynamicDimension.1'); input 'x' axis 3" in err.value.message
    assert f"{model.source} --shape x=1x3x640x640" in err.value.hint
    with pytest.raises(ShapeError) as err:
        model.bind(batch=4)
    assert "--shape x=4x3x640x640" in err.value.hint  # the dims already resolved keep their sizes
    # the command it shows really binds the model
    assert model.bind({"x": (1, 3, 640, 640)}).input_shapes == {"x": (1, 3, 640, 640)}


def test_given_shapes_stay_in_the_command(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "rows", "cols"]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", "rows", "cols"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "rows", "cols"])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "add.onnx"))
    model = load_model(tmp_path / "add.onnx")
    with pytest.raises(ShapeError) as err:
        model.bind({"rows": (4,)})
    assert "input 'a' axis 2 ('cols'); input 'b' axis 2 ('cols')" in err.value.message
    assert "--shape rows=4 --shape cols=128" in err.value.hint


def test_cli_error_shows_the_running_command(pretrained_det):
    from typer.testing import CliRunner

    from onnxaccel.cli.main import app

    result = CliRunner().invoke(app, ["inspect", str(pretrained_det), "-t", "cpu"], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert f"onnxaccel inspect {pretrained_det} --shape x=1x3x640x640" in " ".join(result.output.split())
