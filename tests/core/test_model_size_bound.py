"""Loaders bound their memory (issue 21 item 7): a tensor whose dims declare more bytes than back it is refused
with the numbers before anything reads it (onnx's checker and shape inference with data propagation
materialize the declared size: `inspect` of a 1 KB model grew to 24 GB on main)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxaccel.errors import ModelFormatError
from onnxaccel.model import load_model


def _model(path: Path, tensor: TensorProto) -> Path:
    graph = helper.make_graph([helper.make_node("ReduceSum", ["w"], ["y"], keepdims=0)], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [tensor])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _external(tmp_path: Path, elements: int, file_bytes: int, length: int | None = None) -> Path:
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[elements], data_location=TensorProto.EXTERNAL)
    entries = {"location": "w.bin", "offset": "0", **({"length": str(length)} if length is not None else {})}
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    (tmp_path / "w.bin").write_bytes(b"\0" * file_bytes)
    return _model(tmp_path / "m.onnx", tensor)


def test_external_tensor_declaring_a_terabyte_in_16_bytes_is_refused_with_the_numbers(tmp_path):
    path = _external(tmp_path, 2**40, 16, length=4 * 2**40)
    with pytest.raises(ModelFormatError) as err:
        load_model(path)
    assert "4,398,046,511,104 bytes" in err.value.message and "16 bytes" in err.value.message
    assert "'w'" in err.value.message and "w.bin" in err.value.message


def test_inspect_of_the_crafted_model_stays_small_and_exits_cleanly(tmp_path):
    """The real command, with its address space capped at 4 GB: on main it was killed (24 GB), now a clean model error."""
    path = _external(tmp_path, 2**40, 16)
    cap = 4 << 30
    proc = subprocess.run([str(Path(sys.executable).parent / "onnxaccel"), "inspect", str(path)],
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
    assert proc.returncode == ModelFormatError.exit_code, proc.stderr
    assert "declares" in proc.stderr and "Traceback" not in proc.stderr


def test_embedded_raw_data_shorter_than_its_dims_is_refused(tmp_path):
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 30], raw_data=b"\0" * 8)
    with pytest.raises(ModelFormatError, match="4,294,967,296 bytes, but 8 bytes"):
        load_model(_model(tmp_path / "m.onnx", tensor))


def test_honest_external_data_still_loads_and_runs(tmp_path):
    import onnxruntime as ort

    path = _external(tmp_path, 4, 16)
    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    model = load_model(path)
    session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    assert session.run(None, {})[0] == pytest.approx(6.0)


def _traversal_model(tmp_path: Path) -> Path:
    (tmp_path / "sub").mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    for key, value in {"location": "../secret.bin", "offset": "0", "length": "16"}.items():
        tensor.external_data.add(key=key, value=value)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [tensor])
    path = tmp_path / "sub" / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("extra", [[], ["-p", "fp16"]], ids=["fp32", "fp16"])
def test_external_data_outside_the_model_folder_is_a_clean_refusal_even_without_checks(tmp_path, extra):
    """Issue 21 item 9: `run --no-check -p fp16` on a traversal model said "internal error ... a bug"."""
    path = _traversal_model(tmp_path)
    proc = subprocess.run([str(Path(sys.executable).parent / "onnxaccel"), "run", str(path), "--no-check", *extra],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == ModelFormatError.exit_code, proc.stderr
    text = " ".join(proc.stderr.split())
    assert "'../secret.bin', outside the model's folder" in text and "a bug" not in text
