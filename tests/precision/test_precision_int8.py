"""Dynamic INT8 below the pipeline (what `-p int8` runs on the CPU), and `optimize`'s per-channel path above it."""

from __future__ import annotations

import onnx
import pytest
from model_builders import make_mlp

from onnxaccel.errors import ModelError
from onnxaccel.precision.int8 import Int8Settings, quantize_dynamic, quantized_node_count
from onnxaccel.transform.int8 import quantize_dynamic_proto


def _opset(proto: onnx.ModelProto) -> int:
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def test_per_channel_weights_on_an_old_opset_are_refused_below_and_upgraded_by_optimize(tmp_path):
    old = onnx.load(str(make_mlp(tmp_path / "mlp11.onnx", opset=11)))
    settings = Int8Settings(mode="dynamic", per_channel=True, reduce_range=False)
    with pytest.raises(ModelError, match="opset >= 13") as info:
        quantize_dynamic(old, settings)
    assert "upgrade_for_qdq" in info.value.hint and "--opset 13" in info.value.hint
    quantized = quantize_dynamic_proto(old, settings)  # optimize's entry: opset upgraded first
    assert _opset(quantized) >= 13 and quantized_node_count(quantized)
    onnx.checker.check_model(quantized, full_check=True)


def test_per_tensor_dynamic_int8_needs_no_upgrade(tmp_path):
    old = onnx.load(str(make_mlp(tmp_path / "mlp11.onnx", opset=11)))
    quantized = quantize_dynamic(old, Int8Settings(mode="dynamic", per_channel=False, reduce_range=False))
    assert _opset(quantized) == 11 and quantized_node_count(quantized).get("MatMulInteger") == 2
