"""AMP's divergence search is passed in (transform may not import analysis): without it, a clear usage error
before any work, not an AttributeError in the middle of the search."""

from __future__ import annotations

import pytest

from onnxaccel.cli.optimize import default_gate
from onnxaccel.errors import UsageError
from onnxaccel.target import parse_target
from onnxaccel.transform.optimize import OptimizeOptions, optimize


def test_amp_without_a_divergence_finder_is_a_usage_error_that_names_the_fix(overflow_path, tmp_path):
    options = OptimizeOptions(output=tmp_path / "amp.onnx", target=parse_target("cpu"), shapes={"batch": (4,)},
                              graph_level="none", gate=default_gate("fp16", None, None, None, None, 1),
                              compile_cache=False, amp=True)
    with pytest.raises(UsageError) as caught:
        optimize(str(overflow_path), options)
    assert "divergence finder" in str(caught.value)
    assert "onnxaccel.analysis.bisect.find_divergence" in caught.value.hint
    assert not (tmp_path / "amp.onnx").exists()
