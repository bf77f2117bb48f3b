"""`serve`'s default layout on GPU targets, now the ExecutionPlan's (plan.py; no GPU here, so the choice itself is
tested), and that an explicit layout flag wins; CPU targets keep one process."""

from __future__ import annotations

import pytest

from onnxaccel.plan import Host, PlanRequest, plan_execution
from onnxaccel.target import parse_target


def _plan(target: str, cores: int = 16, **given):
    return plan_execution(parse_target(target), PlanRequest(command="serve", max_batch=8, **given),
                          host=Host(cores=cores))


def test_on_16_cores_a_gpu_server_gets_8_workers_a_model_process_and_4_instances():
    plan = _plan("cuda/fp16")
    assert (plan.workers, plan.shared_models, plan.instances) == (8, True, 4)
    assert plan.graph_capture and plan.target.graph_capture and plan.target.precision == "fp16"
    assert "Override with --workers" in plan.choice("layout").reason or "override with --workers" in \
        plan.choice("layout").reason


@pytest.mark.parametrize("cores, workers, shared, instances", [(1, 1, False, 2), (2, 1, False, 2), (6, 3, True, 2),
                                                                (8, 4, True, 4), (64, 8, True, 4)])
def test_the_layout_scales_with_the_cores(cores, workers, shared, instances):
    plan = _plan("cuda", cores)
    assert (plan.workers, plan.shared_models, plan.instances) == (workers, shared, instances)


def test_cpu_targets_keep_one_process_and_no_graph_is_forced():
    plan = _plan("cpu")
    assert (plan.workers, plan.shared_models, plan.instances, plan.graph_capture) == (1, False, 1, False)
    assert _plan("cuda?enable_cuda_graph=0").target.option_dict["enable_cuda_graph"] == "0"
    assert not _plan("migraphx").graph_capture  # the MIGraphX EP has no graph option


def test_an_explicit_flag_wins():
    given = _plan("cuda", workers=2)
    assert (given.workers, given.shared_models, given.instances, given.graph_capture) == (2, False, 1, False)
    no_shared = _plan("cuda", shared_models=False)
    assert (no_shared.workers, no_shared.shared_models) == (1, False)
    assert _plan("cuda", instances=1).instances == 1
    ray = _plan("cuda", on_ray=True)
    assert (ray.workers, ray.graph_capture) == (1, False)  # Ray Serve runs the replicas
