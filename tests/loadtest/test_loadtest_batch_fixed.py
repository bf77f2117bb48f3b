"""`loadtest --batch N` (N > 1) is refused when no input's axis 0 can carry N rows, since the report counts N rows
per request; it stands where one input takes it. tests/loadtest/test_loadtest_packaged_ocr.py checks the refusal
against a server of a packaged model whose batch axis is fixed to 1."""

from __future__ import annotations

import pytest

from onnxaccel.errors import ShapeError
from onnxaccel.loadtest.shapes import request_dims

SOURCE = "http://localhost:8000 --model m"


def _metadata(**inputs):
    return {"inputs": [{"name": name, "datatype": "FP32", "shape": list(shape)} for name, shape in inputs.items()]}


def test_batch_on_an_axis_fixed_to_one_is_refused_naming_input_and_fix():
    with pytest.raises(ShapeError) as caught:
        request_dims(_metadata(input1=(1, 1, 64, -1)), 2, {"input1": (1, 1, 64, 160)}, SOURCE)
    assert "input 'input1' axis 0 is fixed to 1" in caught.value.message and "--batch 2" in caught.value.message
    assert "--concurrency" in caught.value.hint and caught.value.exit_code == 2


def test_batch_that_disagrees_with_a_full_shape_is_refused():
    with pytest.raises(ShapeError) as caught:
        request_dims(_metadata(x=(-1, 3)), 2, {"x": (4, 3)}, SOURCE)
    assert "--shape x=4x3" in caught.value.message and "--batch 4" in caught.value.hint


def test_batch_stands_where_one_input_takes_it_or_the_fixed_axis_matches():
    dims = request_dims(_metadata(audio=(-1, 512), state=(2, -1, 128)), 4, {"state": (2, 4, 128)}, SOURCE)
    assert dims == {"audio": [4, 512], "state": [2, 4, 128]}
    assert request_dims(_metadata(x=(8, 3)), 8, {}, SOURCE) == {"x": [8, 3]}
    assert request_dims(_metadata(x=(1, 3)), 1, {}, SOURCE) == {"x": [1, 3]}
