"""FP16 after --fix-shape, and FP16 of a model ONNX Runtime's quantizer already made: the written model passes the
full check and loads in ONNX Runtime, or nothing is written.

Models: the pretrained PP-OCR text detector and direction classifier (rapidocr-onnxruntime); the quantized
classifier is made in the test with onnxruntime.quantization (QOperator form: com.microsoft QLinearAdd/QLinearMul).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxaccel.errors import ModelError
from onnxaccel.precision import fp16_rules
from onnxaccel.precision.fp16 import convert_fp16_detailed

CPU = "CPUExecutionProvider"


def _loads_and_runs(path, shape) -> None:
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    session = ort.InferenceSession(str(path), providers=[CPU])
    name = session.get_inputs()[0].name
    outputs = session.run(None, {name: np.random.default_rng(0).random(shape, dtype=np.float32)})
    assert all(np.isfinite(o).all() for o in outputs)


def test_fp16_with_fix_shape_of_the_text_detector_passes_the_full_check_and_runs(invoke, pretrained_det, tmp_path):
    """ONNX Runtime's saved graph of the fixed-shape model keeps value_info for initializers it folded; the
    converter retyped those entries to float16 while the initializers stayed float32 ((1) vs (10))."""
    out = tmp_path / "det.fp16.onnx"
    result = invoke("optimize", pretrained_det, "-o", out, "-t", "cpu", "--fp16", "--shape", "x=1x3x640x640",
                    "--fix-shape", "--no-compile-cache", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["after"]["inputs"] == {"x": [1, 3, 640, 640]} and report["precision"]["fp16"]["converted_nodes"]
    _loads_and_runs(out, (1, 3, 640, 640))


@pytest.fixture(scope="module")
def quantized_cls(pretrained_cls, tmp_path_factory):
    """The classifier quantized by onnxruntime.quantization.quantize_static in the operator form."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.feeds = iter([{"x": rng.random((1, 3, 48, 192), dtype=np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    path = tmp_path_factory.mktemp("quantized") / "cls.qop.onnx"
    quantize_static(str(pretrained_cls), str(path), Reader(), quant_format=QuantFormat.QOperator)
    ops = {(n.domain, n.op_type) for n in onnx.load(str(path)).graph.node}
    assert ("com.microsoft", "QLinearAdd") in ops
    return path


def test_fp16_of_an_ort_quantized_model_keeps_the_contrib_ops_and_loads(invoke, quantized_cls, tmp_path):
    out = tmp_path / "cls.qop.fp16.onnx"
    result = invoke("optimize", quantized_cls, "-o", out, "-t", "cpu", "--fp16", "--shape", "x=1x3x48x192",
                    "--atol", "1", "--rtol", "1", "--no-compile-cache", "--json")
    assert result.exit_code == 0, result.output
    kept = json.loads(result.stdout)["precision"]["fp16"]["kept_fp32_by_op"]
    assert "ONNX Runtime contrib schema (com.microsoft.QLinearAdd-1)" in kept["QLinearAdd"]["reason"]
    assert kept["QLinearMul"]["nodes"] > 0
    _loads_and_runs(out, (1, 3, 48, 192))


def test_an_fp16_model_ort_would_refuse_is_never_written(invoke, quantized_cls, tmp_path, monkeypatch):
    """Without the contrib-schema rule the conversion gives QLinearAdd a float16 scale: refused before writing."""
    monkeypatch.setattr(fp16_rules, "_ort_schemas", lambda: {})
    with pytest.raises(ModelError, match="would not load in ONNX Runtime") as info:
        convert_fp16_detailed(onnx.load(str(quantized_cls)), provider=CPU)
    assert "--keep-fp32" in info.value.hint
    out = tmp_path / "refused.onnx"
    result = invoke("optimize", quantized_cls, "-o", out, "-t", "cpu", "--fp16", "--shape", "x=1x3x48x192",
                    "--no-compile-cache")
    assert result.exit_code == 1 and "would not load in ONNX Runtime" in result.output
    assert not out.exists()
