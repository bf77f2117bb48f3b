"""How many actors and replicas, and what each reserves: one per GPU with num_gpus=1 on GPU targets, autoscaling
options that Ray Serve itself accepts. No cluster needed: the plans are pure functions of the cluster's size."""

from __future__ import annotations

import pytest

from onnxaccel.errors import UsageError
from onnxaccel.scale.ray_data import plan_pool
from onnxaccel.scale.serve_ray import plan_replicas
from onnxaccel.target import parse_target


def test_batch_pool_is_one_actor_per_gpu_with_one_gpu_each():
    plan = plan_pool(parse_target("cuda/fp16"), cluster_gpus=8, cluster_cpus=128, workers=None, cpus_per_worker=1)
    assert (plan.workers, plan.num_gpus) == (8, 1.0)
    assert plan_pool(parse_target("migraphx:1"), 2, 32, workers=1, cpus_per_worker=1).workers == 1
    with pytest.raises(UsageError, match="has none"):
        plan_pool(parse_target("cuda"), 0, 2, None, 1)
    with pytest.raises(UsageError, match="3 workers need 3 GPUs"):
        plan_pool(parse_target("cuda"), 2, 32, 3, 1)
    cpu = plan_pool(parse_target("cpu"), 0, 8, None, cpus_per_worker=2)
    assert (cpu.workers, cpu.num_gpus, cpu.num_cpus) == (4, 0.0, 2.0)


def test_serve_replicas_autoscale_up_to_one_per_gpu_on_queued_requests():
    pytest.importorskip("ray")
    from ray import serve

    plan = plan_replicas(parse_target("cuda:0/fp16"), cluster_gpus=2, cluster_cpus=32, replicas=None, min_replicas=1,
                         max_replicas=None, max_batch=32, target_ongoing_requests=None, cpus_per_replica=1)
    options = plan.deployment_options()
    assert options["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1.0}
    assert options["autoscaling_config"]["min_replicas"] == 1 and options["autoscaling_config"]["max_replicas"] == 2
    assert options["autoscaling_config"]["target_ongoing_requests"] == 64  # two full dynamic batches per replica
    assert options["max_ongoing_requests"] >= 2 * 64
    serve.deployment(name="check")(_Replica).options(**options)  # Ray Serve validates the options here
    fixed = plan_replicas(parse_target("cuda"), 2, 32, replicas=2, min_replicas=1, max_replicas=None, max_batch=8,
                          target_ongoing_requests=None, cpus_per_replica=1).deployment_options()
    assert fixed["num_replicas"] == 2 and "autoscaling_config" not in fixed
    with pytest.raises(UsageError, match="--replicas 3 needs 3 GPUs"):
        plan_replicas(parse_target("cuda"), 2, 32, replicas=3, min_replicas=1, max_replicas=None, max_batch=8,
                      target_ongoing_requests=None, cpus_per_replica=1)


class _Replica:
    def __call__(self, request):
        return "ok"
