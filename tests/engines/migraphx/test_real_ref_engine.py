"""The native engine's own code (engines/migraphx.py) against the REAL MIGraphX, reference target.

AMD's MIGraphX built from upstream source (scripts/build-migraphx-ref: ROCm/AMDMIGraphX f729a52, reference
target and Python module only) parses, quantizes, compiles and runs the model here, on the CPU; ONNX Runtime's
CPU provider is the reference. Skipped, with the reason, where that build is absent. NOT EXECUTED ON AMD
HARDWARE: the ref target is MIGraphX's plain C++ reference; the GPU target's kernels are not exercised.
"""

from __future__ import annotations

import numpy as np

from native_helpers import native, ort_reference
from onnxaccel.engines import compile_model
from onnxaccel.engines.migraphx import NATIVE, MigraphxEngine
from onnxaccel.model import load_model


def feeds(shape, seed=0, scale=1.0):
    return {"x": (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)}


def migraphx_program(runner, batch: int):
    """The migraphx.program the runner compiled for a batch size (what MIGraphX itself says it holds)."""
    return next(p.prog for key, p in runner._programs.items() if key[0][1][0] == batch)


def test_parse_binds_the_model_shapes_through_map_input_dims(real_mgx, mlp_file):
    runner = compile_model(load_model(mlp_file).bind(batch=3), native())
    prog = migraphx_program(runner, 3)
    params = prog.get_parameter_shapes()
    assert params["x"].lens() == [3, 4] and params["x"].type_string() == "float_type"
    assert prog.is_compiled() and runner.providers == [NATIVE]
    assert runner.describe()["migraphx_target"] == "ref"
    x = feeds((3, 4))
    got, want = runner.run(x)["probs"], ort_reference(mlp_file, x)["probs"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got.dtype == np.float32 and got.shape == (3, 3)


def test_another_batch_size_compiles_another_static_program(real_mgx, mlp):
    runner = compile_model(mlp, native(cache=0))
    x = feeds((5, 4), seed=1)
    np.testing.assert_allclose(runner.run(x)["probs"], ort_reference(mlp.path, x)["probs"], rtol=1e-5, atol=1e-6)
    assert migraphx_program(runner, 5).get_parameter_shapes()["x"].lens() == [5, 4]
    assert any("new input shapes x=5x4: compiled another program" in w for w in runner.warnings)


def test_fp16_quantizes_the_program_to_half_and_stays_close(real_mgx, mlp):
    runner = compile_model(mlp, native("fp16", cache=0))
    assert "half_type" in repr(migraphx_program(runner, 2))  # quantize_fp16 rewrote the program
    x = feeds((2, 4), seed=2)
    got, want = runner.run(x)["probs"], ort_reference(mlp.path, x)["probs"]
    assert got.dtype == np.float32  # the engine returns the declared type
    assert not np.array_equal(got, want)  # computed in half
    np.testing.assert_allclose(got, want, atol=1e-2)


def test_int8_quantizes_with_the_calibration_data_given(real_mgx, cnn):
    small = [feeds((2, 3, 8, 8), seed=s) for s in (3, 4)]
    large = [feeds((2, 3, 8, 8), seed=s, scale=50.0) for s in (3, 4)]
    runner = MigraphxEngine().compile(cnn, native("int8", cache=0), calibration=small)
    assert "quantizelinear" in repr(migraphx_program(runner, 2))
    x = feeds((2, 3, 8, 8), seed=5)
    got, want = runner.run(x)["logits"], ort_reference(cnn.path, x)["logits"]
    assert not np.array_equal(got, want)
    # INT8 with two calibration samples: within a quarter of the output range, as fake-quantization on the ref
    # target gives (quantizelinear/dequantizelinear around float ops)
    np.testing.assert_allclose(got, want, atol=0.25 * float(np.abs(want).max()))
    coarse = MigraphxEngine().compile(cnn, native("int8", cache=0), calibration=large).run(x)["logits"]
    # scales come from the data: calibrated on 50x wider inputs, the same input is quantized more coarsely
    assert np.abs(coarse - want).max() > np.abs(got - want).max()


def test_int8_calibration_buffers_outlive_quantize_int8(real_mgx, cnn):
    """argument(buffer) keeps only the address: strided samples are copied into buffers that the engine keeps
    until quantize_int8 returns. Made from temporaries, the arguments would point at freed memory."""
    samples = [feeds((2, 3, 8, 8), seed=6, scale=4.0), feeds((2, 3, 8, 8), seed=7)]
    strided = [{"x": np.asfortranarray(s["x"])} for s in samples]
    x = feeds((2, 3, 8, 8), seed=8)
    want = MigraphxEngine().compile(cnn, native("int8", cache=0), calibration=samples).run(x)["logits"]
    got = MigraphxEngine().compile(cnn, native("int8", cache=0), calibration=strided).run(x)["logits"]
    np.testing.assert_array_equal(got, want)
