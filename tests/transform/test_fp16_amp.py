"""FP16 conversion and automatic mixed precision, checked against FP32 on real and adversarial models."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto

from onnxaccel.analysis.bisect import find_divergence
from onnxaccel.cli.optimize import default_gate
from onnxaccel.model import load_model
from onnxaccel.precision import prepare_for_target
from onnxaccel.precision.fp16 import KEEP_FP32_KEY, keep_fp32_nodes, set_keep_fp32_nodes
from onnxaccel.target import parse_target
from onnxaccel.transform.optimize import OptimizeOptions, optimize

from text_images import PREPROCESS_ARGS


def _initializer_types(path) -> dict[str, int]:
    return {t.name: t.data_type for t in onnx.load(str(path)).graph.initializer}


def test_fp16_pretrained_classifier_agrees_with_fp32_on_text_images(invoke, pretrained_cls, eval_images, tmp_path):
    out = tmp_path / "cls.fp16.onnx"
    result = invoke("optimize", pretrained_cls, "-o", out, "-t", "cpu", "--shape", "x=1x3x48x192", "--fp16",
                    "--eval-data", eval_images, "--eval-samples", "64", *PREPROCESS_ARGS,
                    "--min-topk-agreement", "0.98", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "onnxaccel.optimize/1" and report["passed"]
    assert report["after"]["precision"] == "fp16"
    # Weights halve (a few stay FP32: shapes and the ops ORT's converter blocks).
    fp32_bytes = report["before"]["weights_bytes_by_type"]["float32"]
    assert report["after"]["weights_bytes_by_type"].get("float16", 0) > 0.9 * fp32_bytes / 2
    (output,) = report["accuracy"]["comparison"]["outputs"]
    # Observed on ORT 1.32 CPU: max abs error 0.009 on probabilities, top-1 agreement 64/64.
    assert output["max_abs"] < 0.02 and output["topk"]["top1"] == 1.0
    assert {c["name"] for c in report["accuracy"]["checks"]} >= {"finite", "elementwise", "topk_agreement"}


def _options(tmp_path, name: str, **kw) -> OptimizeOptions:
    precision = "fp16" if kw.get("fp16") or kw.get("amp") else "fp32"
    return OptimizeOptions(output=tmp_path / name, target=parse_target("cpu"), shapes={"batch": (4,)},
                           graph_level="none", gate=default_gate(precision, None, None, None, None, 1),
                           compile_cache=False, **kw)


def test_amp_keeps_the_overflowing_node_fp32_and_passes_where_plain_fp16_fails(overflow_path, tmp_path):
    plain = optimize(str(overflow_path), _options(tmp_path, "plain.onnx", fp16=True), find_divergence)
    assert not plain.passed
    assert any(c["name"] == "elementwise" and not c["passed"] for c in plain.accuracy["checks"])

    amp = optimize(str(overflow_path), _options(tmp_path, "amp.onnx", amp=True), find_divergence)
    assert amp.passed, amp.accuracy["checks"]
    kept = amp.precision["keep_fp32"]
    assert "scale_up" in kept
    assert not {"proj", "head", "relu"} & set(kept), kept  # the rest stays FP16
    assert amp.precision["amp"]["steps"][0]["method"] == "divergence"
    assert amp.precision["amp"]["steps"][0]["nodes"] == ["scale_up"]
    types = _initializer_types(tmp_path / "amp.onnx")
    assert types["W"] == types["W2"] == TensorProto.FLOAT16
    assert types["up"] == TensorProto.FLOAT  # 1e5 survives because its node stayed FP32
    metadata = {p.key: p.value for p in onnx.load(str(tmp_path / "amp.onnx")).metadata_props}
    assert json.loads(metadata[KEEP_FP32_KEY]) == kept


def test_run_precision_fp16_honours_the_models_keep_list(overflow_path, tmp_path):
    proto = onnx.load(str(overflow_path))
    set_keep_fp32_nodes(proto, ["scale_up"])
    tagged = tmp_path / "tagged.onnx"
    onnx.save(proto, str(tagged))
    model = load_model(str(tagged)).bind({"batch": (2,)})
    converted, engine_target = prepare_for_target(model, parse_target("cpu/fp16"))
    assert engine_target.precision == "fp32" and keep_fp32_nodes(converted.proto) == ["scale_up"]
    assert _initializer_types(converted.path)["up"] == TensorProto.FLOAT
    assert any("kept in FP32" in n for n in converted.notes)
    from onnxaccel.engines import compile_model

    x = np.random.default_rng(1).random((2, 16), dtype=np.float32)
    reference = compile_model(model, parse_target("cpu")).run({"x": x})["logits"]
    fp16 = compile_model(converted, engine_target).run({"x": x})["logits"]
    np.testing.assert_allclose(fp16, reference, atol=1e-2, rtol=5e-2)
