"""The stand-in `migraphx` module behaves like the documented API where the engine depends on it.

NOT EXECUTED ON AMD HARDWARE. These tests pin the stand-in to the facts it was written from (ROCm/AMDMIGraphX
src/py/migraphx_py.cpp at f729a52 and the MIGraphX sources it cites), so that the engine
tests below it mean something: a wrong argument name, type or order in the engine fails against the stand-in
as it would against pybind11.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest


def test_signatures_and_defaults_match_the_python_binding(fake_mgx):
    mgx = fake_mgx
    parse = inspect.signature(mgx.parse_onnx).parameters
    assert list(parse)[:5] == ["filename", "default_dim_value", "default_dyn_dim_value", "dim_params", "map_input_dims"]
    assert parse["default_dim_value"].default == 0  # the binding's default (the doc page says 1)
    assert parse["skip_unknown_operators"].default is False
    compile_ = inspect.signature(mgx.program.compile).parameters
    assert [(n, p.default) for n, p in compile_.items()][1:] == [
        ("t", inspect.Parameter.empty), ("offload_copy", True), ("fast_math", True), ("exhaustive_tune", False)]
    assert inspect.signature(mgx.save).parameters["format"].default == "msgpack"
    assert inspect.signature(mgx.load).parameters["format"].default == "msgpack"
    assert set(inspect.signature(mgx.quantize_int8).parameters["ins_names"].default) == {"dot", "convolution"}
    assert list(inspect.signature(mgx.quantize_fp16).parameters["ins_names"].default) == ["all"]


def test_pybind_style_type_errors(fake_mgx, mlp_file):
    mgx = fake_mgx
    with pytest.raises(TypeError, match="incompatible function arguments"):
        mgx.parse_onnx(Path(mlp_file))  # std::string parameter: no pathlib.Path
    prog = mgx.parse_onnx(str(mlp_file), map_input_dims={"x": [2, 4]})
    with pytest.raises(TypeError, match="incompatible function arguments"):
        prog.compile(mgx.get_target("gpu"), offload_copy="1")  # a string is not a bool
    with pytest.raises(TypeError, match="incompatible function arguments"):
        mgx.parse_onnx(str(mlp_file), map_input_dims={"x": "2x4"})
    with pytest.raises(TypeError, match="incompatible function arguments"):
        mgx.quantize_int8(prog, mgx.get_target("gpu"), calibration=[{"x": np.ones((2, 4), np.float32)}])


def test_errors_carry_migraphx_messages(fake_mgx, mlp_file, tmp_path):
    mgx = fake_mgx
    with pytest.raises(RuntimeError, match="PARSE_FROM: Failed reading onnx file"):
        mgx.parse_onnx(str(tmp_path / "missing.onnx"))
    with pytest.raises(RuntimeError, match="both default_dim_value and default_dyn_dim_value"):
        mgx.parse_onnx(str(mlp_file), default_dim_value=2, default_dyn_dim_value=mgx.shape.dynamic_dimension(1, 4))
    with pytest.raises(RuntimeError, match="failed with libmigraphx_cpu.so: cannot open shared object file"):
        mgx.get_target("cpu")
    prog = mgx.parse_onnx(str(mlp_file), map_input_dims={"x": [2, 4]})
    with pytest.raises(RuntimeError, match="QUANTIZE_INT8: only support DOT and CONVOLUTION operation"):
        mgx.quantize_int8(prog, mgx.get_target("gpu"), ins_names={"dot"})
    prog.compile(mgx.get_target("gpu"))
    with pytest.raises(RuntimeError, match="Parameter not found: x"):
        prog.run({})
    with pytest.raises(RuntimeError, match=r"Incorrect shape \{double_type, \{2, 4\}, \{4, 1\}\} for parameter: x"):
        prog.run({"x": np.ones((2, 4))})
    with pytest.raises(RuntimeError, match=r"Incorrect shape \{float_type, \{2, 4\}, \{1, 2\}\}"):
        prog.run({"x": np.ones((4, 2), np.float32).T})  # strides count: non-contiguous is another shape
    with pytest.raises(RuntimeError, match="stand-in: quantize_fp16.. on a compiled program"):
        mgx.quantize_fp16(prog)


def test_parameters_come_from_map_input_dims_and_default_dim_value(fake_mgx, mlp_file):
    mgx = fake_mgx
    prog = mgx.parse_onnx(str(mlp_file), map_input_dims={"x": [3, 4]})
    shape = prog.get_parameter_shapes()["x"]
    assert shape.lens() == [3, 4] and shape.type_string() == "float_type" and repr(shape) == "float_type, {3, 4}, {4, 1}"
    assert mgx.parse_onnx(str(mlp_file), default_dim_value=5).get_parameter_shapes()["x"].lens() == [5, 4]
    assert mgx.parse_onnx(str(mlp_file)).get_parameter_shapes()["x"].lens() == [1, 4]  # 0 -> dyn {1, 1}


def test_run_returns_arguments_that_numpy_reads_and_nothing_more(fake_mgx, mlp_file):
    mgx = fake_mgx
    prog = mgx.parse_onnx(str(mlp_file), map_input_dims={"x": [2, 4]})
    prog.compile(mgx.get_target("gpu"))
    (out,) = prog.run({"x": np.ones((2, 4), np.float32)})
    assert isinstance(out, mgx.argument)
    assert np.array(out).shape == (2, 3) and out.get_shape().lens() == [2, 3]
    assert not hasattr(out, "shape") and not hasattr(out, "astype")


def test_offload_copy_false_programs_take_gpu_buffers_including_outputs(fake_mgx, mlp_file):
    mgx = fake_mgx
    prog = mgx.parse_onnx(str(mlp_file), map_input_dims={"x": [2, 4]})
    prog.compile(mgx.get_target("gpu"), offload_copy=False)
    params = prog.get_parameter_shapes()
    assert sorted(params) == ["main:#output_0", "x"]
    with pytest.raises(RuntimeError, match="host buffer"):
        prog.run({"x": np.ones((2, 4), np.float32), "main:#output_0": mgx.allocate_gpu(params["main:#output_0"])})
    host = np.ones((2, 4), np.float32)  # argument() keeps only the address: the array must outlive to_gpu()
    x = mgx.to_gpu(mgx.argument(host))
    (out,) = prog.run({"x": x, "main:#output_0": mgx.allocate_gpu(params["main:#output_0"])})
    with pytest.raises(RuntimeError, match="from_gpu"):
        np.array(out)
    assert np.array(mgx.from_gpu(out)).shape == (2, 3)


def test_save_and_load_round_trip_a_compiled_program(fake_mgx, mlp_file, tmp_path):
    mgx = fake_mgx
    prog = mgx.parse_onnx(str(mlp_file), map_input_dims={"x": [2, 4]})
    mgx.quantize_fp16(prog)
    prog.compile(mgx.get_target("gpu"))
    mgx.save(prog, str(tmp_path / "p.mxr"))
    loaded = mgx.load(str(tmp_path / "p.mxr"))
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    assert loaded.is_compiled()
    np.testing.assert_array_equal(np.array(loaded.run({"x": x})[0]), np.array(prog.run({"x": x})[0]))
    with pytest.raises(RuntimeError, match="Failure opening file"):
        mgx.load(str(tmp_path / "none.mxr"))
