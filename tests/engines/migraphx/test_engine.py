"""The native MIGraphX engine drives the migraphx API as documented: parse with the bound shapes, quantize
before compile, compile with the target's options, run numpy feeds, and report placement and compile time.

NOT EXECUTED ON AMD HARDWARE: `migraphx` here is the stand-in (tests/engines/migraphx/fake_migraphx), which
computes with ONNX Runtime on the CPU. Numerics below compare the engine's outputs with ONNX Runtime's; they
prove the data goes in and comes out right, not how MIGraphX's GPU kernels round.
"""

from __future__ import annotations

import numpy as np
import pytest

from native_helpers import calls, native, ort_reference
from onnxaccel.engines import compile_model
from onnxaccel.engines.migraphx import NATIVE, MigraphxEngine
from onnxaccel.errors import (
    InputError, PlacementError, ProviderOptionError, ProviderUnavailableError, ShapeError, TargetError,
)


def feeds(batch=2, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((batch, 4)).astype(np.float32)}


def test_parse_quantize_compile_save_in_that_order_with_the_bound_shapes(fake_mgx, mlp):
    runner = compile_model(mlp, native("fp16"))
    assert calls(fake_mgx)[:5] == ["parse_onnx", "quantize_fp16", "get_target", "compile", "save"]
    parse = dict(fake_mgx._calls)["parse_onnx"]
    assert parse["map_input_dims"] == {"x": [2, 4]} and parse["default_dim_value"] == 1
    compile_ = dict(fake_mgx._calls)["compile"]
    assert compile_ == {"target": "gpu", "offload_copy": True, "fast_math": True, "exhaustive_tune": False,
                        "precision": "fp16"}
    assert runner.providers == [NATIVE] and runner.compile_seconds > 0 and runner.cache_hit is False


def test_fp32_outputs_match_onnx_runtime(fake_mgx, mlp):
    runner = compile_model(mlp, native())
    got = runner.run(feeds())
    want = ort_reference(mlp.path, feeds())
    np.testing.assert_allclose(got["probs"], want["probs"], rtol=1e-6)
    assert got["probs"].dtype == np.float32


@pytest.mark.parametrize("precision, quantizer", [("fp16", "quantize_fp16"), ("bf16", "quantize_bf16")])
def test_half_precisions_use_migraphx_quantization_and_stay_close(fake_mgx, mlp, precision, quantizer):
    runner = compile_model(mlp, native(precision))
    assert quantizer in calls(fake_mgx)
    got, want = runner.run(feeds())["probs"], ort_reference(mlp.path, feeds())["probs"]
    assert not np.array_equal(got, want)  # rounded, as a half program is
    np.testing.assert_allclose(got, want, atol=2e-2)


def test_target_options_reach_compile(fake_mgx, mlp):
    compile_model(mlp, native(exhaustive_tune=1, fast_math=0, offload_copy=0, default_dim_value=3))
    compile_ = dict(fake_mgx._calls)["compile"]
    assert (compile_["exhaustive_tune"], compile_["fast_math"], compile_["offload_copy"]) == (True, False, False)
    assert dict(fake_mgx._calls)["parse_onnx"]["default_dim_value"] == 3


def test_int8_calibrates_on_given_samples_before_compile(fake_mgx, cnn):
    rng = np.random.default_rng(3)
    samples = [{"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    runner = MigraphxEngine().compile(cnn, native("int8"), calibration=samples)
    order = calls(fake_mgx)
    assert order.index("quantize_int8") < order.index("compile")
    assert dict(fake_mgx._calls)["quantize_int8"] == {"target": "gpu", "samples": 4,
                                                      "ins_names": ["convolution", "dot"]}
    x = {"x": samples[0]["x"]}
    np.testing.assert_allclose(runner.run(x)["logits"], ort_reference(cnn.path, x)["logits"], atol=0.1)


def test_int8_reads_calibration_data_the_way_optimize_does(fake_mgx, cnn, tmp_path):
    rng = np.random.default_rng(4)
    np.savez(tmp_path / "cal.npz", x=rng.standard_normal((6, 3, 8, 8)).astype(np.float32))
    small = native("int8", calibration=tmp_path / "cal.npz", calibration_samples=3)
    runner = compile_model(cnn, small)
    assert dict(fake_mgx._calls)["quantize_int8"]["samples"] == 3  # 6 rows at batch 2, capped at 3 samples
    assert not any("SYNTHETIC" in w for w in runner.warnings)


def test_int8_without_calibration_uses_synthetic_data_and_says_so(fake_mgx, cnn):
    runner = compile_model(cnn, native("int8"))
    assert any("SYNTHETIC" in w for w in runner.warnings)


def test_calibration_data_changes_the_program(fake_mgx, cnn):
    x = {"x": np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32) * 3}
    tiny = [{"x": x["x"] * 0.01}]
    wide = [{"x": x["x"]}]
    a = MigraphxEngine().compile(cnn, native("int8"), calibration=tiny).run(x)["logits"]
    b = MigraphxEngine().compile(cnn, native("int8"), calibration=wide).run(x)["logits"]
    assert not np.allclose(a, b)  # ranges from the calibration set clip (or not) the real inputs


def test_bf16_on_a_migraphx_without_quantize_bf16_is_a_clear_error(fake_mgx, mlp, monkeypatch):
    monkeypatch.delattr(fake_mgx, "quantize_bf16")
    with pytest.raises(TargetError, match="has no quantize_bf16") as info:
        compile_model(mlp, native("bf16"))
    assert "fp16" in info.value.hint


def test_placement_puts_every_node_on_migraphx(fake_mgx, mlp):
    placement = compile_model(mlp, native()).placement
    assert placement.requested == NATIVE and placement.count(NATIVE) == 4 and not placement.fallback
    assert placement.summary() == "MIGraphX took 4/4 nodes" and placement.method == "parse_onnx"


def test_unsupported_operators_are_listed_before_compiling(fake_mgx, tmp_path):
    from onnx import TensorProto, helper, save

    from onnxaccel.model import load_model

    graph = helper.make_graph(
        [helper.make_node("Unique", ["x"], ["y"], name="u"), helper.make_node("Relu", ["y"], ["z"], name="r")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(tmp_path / "u.onnx"))
    with pytest.raises(PlacementError, match=r"cannot parse 1 node\(s\).*Unique x1") as info:
        compile_model(load_model(tmp_path / "u.onnx").bind(), native())
    assert "--target migraphx" in info.value.hint and "compile" not in calls(fake_mgx)
    # An older MIGraphX without get_onnx_operators(): parse_onnx's own "Unknown operator" says it.
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.delattr(fake_mgx, "get_onnx_operators")
    try:
        with pytest.raises(PlacementError, match="no parser for the ONNX operator Unique"):
            compile_model(load_model(tmp_path / "u.onnx").bind(), native())
    finally:
        monkeypatch.undo()


def test_no_gpu_is_reported_as_an_unavailable_device(fake_mgx, mlp, monkeypatch):
    monkeypatch.setenv("FAKE_MIGRAPHX_NO_GPU", "1")
    with pytest.raises(ProviderUnavailableError, match="no AMD GPU is visible") as info:
        compile_model(mlp, native())
    assert "/dev/kfd" in info.value.hint


def test_device_ids_other_than_0_are_refused_with_the_env_var_to_use(fake_mgx, mlp):
    with pytest.raises(TargetError, match="cannot pick GPU 1") as info:
        compile_model(mlp, native(device_id=1))
    assert "HIP_VISIBLE_DEVICES=1" in info.value.hint


@pytest.mark.parametrize("key, expected", [
    ("migraphx_exhaustive_tune", "exhaustive_tune=1"), ("migraphx_model_cache_dir", "model_cache_dir=DIR"),
    ("intra_op_num_threads", "session option"), ("prefer_nhwc", "Native options")])
def test_options_of_other_runtimes_are_rejected_with_the_native_equivalent(fake_mgx, mlp, key, expected):
    with pytest.raises(ProviderOptionError) as info:
        compile_model(mlp, native(**{key: "1"}))
    assert expected in f"{info.value.message} {info.value.hint}"


def test_bad_option_values_are_rejected(fake_mgx, mlp):
    with pytest.raises(ProviderOptionError, match="must be 0 or 1"):
        compile_model(mlp, native(fast_math="maybe"))


def test_bad_inputs_get_clear_errors(fake_mgx, mlp):
    runner = compile_model(mlp, native())
    with pytest.raises(InputError, match="Unknown input name"):
        runner.run({"y": np.ones((2, 4), np.float32)})
    with pytest.raises(InputError, match="expects float32"):
        runner.run({"x": np.ones((2, 4), np.complex64)})
    with pytest.raises(InputError, match="axis 1 must be 4"):
        runner.run({"x": np.ones((2, 5), np.float32)})


def test_feeds_are_made_contiguous_and_cast_losslessly(fake_mgx, mlp):
    runner = compile_model(mlp, native())
    x = np.asfortranarray(feeds()["x"])
    np.testing.assert_allclose(runner.run({"x": x})["probs"], runner.run(feeds())["probs"])
    assert runner.run({"x": np.ones((2, 4), np.float16)})["probs"].shape == (2, 3)  # safe cast to float32


def test_a_new_batch_size_compiles_another_program_and_says_so(fake_mgx, mlp):
    runner = compile_model(mlp, native())
    out = runner.run(feeds(batch=5))
    assert out["probs"].shape == (5, 3) and len(runner.programs()) == 2
    assert any("new input shapes x=5x4" in w for w in runner.warnings)
    runner.run(feeds(batch=5))
    assert calls(fake_mgx).count("parse_onnx") == 2  # the second run at 5 reuses its program


def test_int8_programs_for_other_batch_sizes_reuse_the_calibration_rows(fake_mgx, cnn):
    samples = [{"x": np.random.default_rng(6).standard_normal((2, 3, 8, 8)).astype(np.float32)}]
    runner = MigraphxEngine().compile(cnn, native("int8"), calibration=samples)
    assert runner.run({"x": np.ones((3, 3, 8, 8), np.float32)})["logits"].shape == (3, 5)


def test_shared_symbolic_dims_must_agree(fake_mgx, tmp_path):
    from onnx import TensorProto, helper, save

    from onnxaccel.model import load_model

    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"], name="add")], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 2]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 2])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["n", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(tmp_path / "add.onnx"))
    runner = compile_model(load_model(tmp_path / "add.onnx").bind(batch=1), native())
    with pytest.raises(ShapeError, match="'n'"):
        runner.run({"a": np.ones((2, 2), np.float32), "b": np.ones((3, 2), np.float32)})


def test_bind_with_offload_copy_keeps_host_arrays_and_says_copies_are_timed(fake_mgx, mlp):
    runner = compile_model(mlp, native())
    bound = runner.bind(feeds())
    bound.run()
    np.testing.assert_allclose(bound.outputs()["probs"], runner.run(feeds())["probs"])
    assert any("offload_copy=1" in w for w in runner.warnings)
    bound.update(feeds(seed=9))
    bound.run()
    np.testing.assert_allclose(bound.outputs()["probs"], runner.run(feeds(seed=9))["probs"])
    with pytest.raises(InputError, match="bind\\(\\) again"):
        bound.update(feeds(batch=3))


def test_bind_without_offload_copy_keeps_inputs_and_outputs_on_the_gpu(fake_mgx, mlp):
    runner = compile_model(mlp, native(offload_copy=0))
    bound = runner.bind(feeds())
    assert all(isinstance(v, fake_mgx.argument) and v._device for v in bound.params.values())
    bound.run()
    assert "gpu_sync" in calls(fake_mgx)
    np.testing.assert_allclose(bound.outputs()["probs"], ort_reference(mlp.path, feeds())["probs"], rtol=1e-6)
    np.testing.assert_allclose(runner.run(feeds())["probs"], bound.outputs()["probs"])
    assert not any("offload_copy=1" in w for w in runner.warnings)


def test_describe_reports_version_options_and_programs(fake_mgx, mlp):
    info = compile_model(mlp, native("fp16")).describe()
    assert info["engine"] == "migraphx" and info["migraphx_version"] == fake_mgx.__version__
    assert info["providers"] == [NATIVE] and info["options"]["fast_math"] is True
    (program,) = info["programs"]
    assert program["shapes"] == {"x": [2, 4]} and program["cache_hit"] is False and program["compile_seconds"] >= 0


def test_probe_compiles_and_runs_a_one_node_program(fake_mgx, monkeypatch):
    from onnxaccel.engines.migraphx_probe import probe

    assert probe().loaded
    monkeypatch.setenv("FAKE_MIGRAPHX_NO_GPU", "1")
    result = probe()
    assert not result.loaded and result.cause == "no AMD GPU is visible"
