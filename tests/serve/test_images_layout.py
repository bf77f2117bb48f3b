"""`serve`'s default layout on GPU targets (serve/layout.py; no GPU here, so the choice itself is tested), and that
an explicit layout flag wins; CPU targets keep one process."""

from __future__ import annotations

import pytest

from onnxaccel.cli.serve import _layout
from onnxaccel.serve.layout import choose_layout, layout_flags_given
from onnxaccel.target import parse_target


def test_the_h200_measurement_is_the_choice_on_16_cores():
    layout = choose_layout(16, parse_target("cuda/fp16"))
    assert (layout.workers, layout.shared_models, layout.instances, layout.automatic) == (8, True, 4, True)
    assert parse_target(layout.target).graph_capture  # enable_cuda_graph=1 added; dropped per model if it cannot
    assert parse_target(layout.target).precision == "fp16"
    text = layout.describe()
    assert "--workers 8 --shared-models --instances 4" in text and "Override with --workers" in text


@pytest.mark.parametrize("cores, workers, shared, instances", [(1, 1, False, 2), (2, 1, False, 2), (6, 3, True, 2),
                                                                (8, 4, True, 4), (64, 8, True, 4)])
def test_the_layout_scales_with_the_cores(cores, workers, shared, instances):
    layout = choose_layout(cores, parse_target("cuda"))
    assert (layout.workers, layout.shared_models, layout.instances) == (workers, shared, instances)


def test_cpu_targets_keep_today_s_defaults_and_no_graph_is_forced():
    layout = choose_layout(16, parse_target("cpu"))
    assert (layout.workers, layout.shared_models, layout.instances, layout.automatic) == (1, False, None, False)
    # a graph option the user set is kept as given, and MIGraphX gets no graph option
    assert "enable_cuda_graph=0" in choose_layout(16, parse_target("cuda?enable_cuda_graph=0")).target
    assert not parse_target(choose_layout(16, parse_target("migraphx")).target).graph_capture


def test_an_explicit_flag_wins():
    cuda = parse_target("cuda")
    assert layout_flags_given(2, None, None) and layout_flags_given(None, False, None)
    assert layout_flags_given(None, None, 1) and not layout_flags_given(None, None, None)
    given = _layout(cuda, 2, None, None, False)
    assert (given.workers, given.shared_models, given.instances, given.automatic) == (2, False, None, False)
    no_shared = _layout(cuda, None, False, None, False)
    assert (no_shared.workers, no_shared.shared_models, no_shared.automatic) == (1, False, False)
    one = _layout(cuda, None, None, 1, False)
    assert (one.workers, one.instances, one.automatic) == (1, 1, False)
    assert not _layout(cuda, None, None, None, True).automatic  # Ray Serve runs the replicas
    assert _layout(cuda, None, None, None, False).automatic
