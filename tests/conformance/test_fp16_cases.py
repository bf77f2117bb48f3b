"""`optimize --fp16` on ONNX's own node cases that plain ONNX Runtime passes: the FP16 model is valid, keeps the
caller's interface, and answers within FP16 tolerance (issue 17, "Must show").

Each case below failed before the fix named next to it (benchmarks/results/conformance_cpu.md of 8060555):
sequence inputs/outputs retyped to seq(float16) (SplitToSequence, SequenceMap), ScatterND/ScatterElements
reductions that ONNX Runtime's CPU kernel refuses in float16 at run time, cancellation error in AffineGrid /
LinearAttention judged per element, a quantized output one step away.
"""

from __future__ import annotations

import onnx
import pytest

from onnxaccel.compare.tolerance import TolerancePolicy
from onnxaccel.conformance import discover
from onnxaccel.errors import ModelError
from onnxaccel.precision.fp16 import convert_fp16_detailed
from onnxaccel.target import parse_target

CASES = [
    # sequence-of-float inputs/outputs stay float (a Loop casts each element)
    "test_split_to_sequence_1", "test_split_to_sequence_nokeepdims",
    "test_sequence_map_add_1_sequence_1_tensor", "test_sequence_map_identity_1_sequence_1_tensor",
    "test_sequence_map_add_2_sequences_expanded",
    # float16 reductions ONNX Runtime's CPU kernels refuse at run time stay FP32 (conversion is then a no-op)
    "test_scatter_elements_with_reduction_mul", "test_scatternd_add",
    # error scaled to the tensor's largest value; one quantization step
    "test_affine_grid_3d_align_corners", "test_linear_attention_linear",
    "test_dynamicquantizelinear_min_adjusted_expanded",
    # no float16 EyeLike kernel on the CPU: kept FP32, so a no-op, refused
    "test_eyelike_populate_off_main_diagonal",
]


@pytest.fixture(scope="module")
def fp16_report(node_dir, benchmark_module, tmp_path_factory):
    cases = [c for c in discover([node_dir]) if c.name.split("/")[-1] in CASES]
    assert len(cases) == len(CASES)
    return benchmark_module.fp16_run(cases, parse_target("cpu"), tmp_path_factory.mktemp("fp16"),
                                     TolerancePolicy(precision="fp16"))


def test_fp16_models_of_these_cases_are_valid_and_within_fp16_tolerance(fp16_report):
    assert fp16_report["checker_failures"] == []
    assert fp16_report["not_passing"] == []
    assert fp16_report["check"]["pass"] == fp16_report["checker_pass"] >= 7


def test_kernels_the_cpu_refuses_at_run_time_keep_the_node_fp32(fp16_report):
    noops = {n["case"].split("/")[-1]: n["reason"] for n in fp16_report["noops"]}
    assert "reduction='add'" in noops["test_scatternd_add"]
    assert "reduction='mul'" in noops["test_scatter_elements_with_reduction_mul"]
    assert "EyeLike" in noops["test_eyelike_populate_off_main_diagonal"]


def test_sequence_outputs_and_inputs_keep_float32(node_dir):
    proto = onnx.load(str(node_dir / "test_sequence_map_add_1_sequence_1_tensor" / "model.onnx"))
    converted = convert_fp16_detailed(proto, provider="CPUExecutionProvider")
    for value in list(converted.proto.graph.input) + list(converted.proto.graph.output):
        if value.type.HasField("sequence_type"):
            assert value.type.sequence_type.elem_type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert converted.converted == {"SequenceMap": 1}


def test_a_model_that_fails_the_checker_as_given_is_not_called_our_bug(node_dir):
    proto = onnx.load(str(node_dir / "test_mvn" / "model.onnx"))
    with pytest.raises(ModelError) as info:
        convert_fp16_detailed(proto, provider="CPUExecutionProvider")
    assert "before any conversion" in info.value.message
    assert "bug in onnxaccel" not in info.value.message + (info.value.hint or "")
