"""The ExecutionPlan (plan.py): each decision made once, with its reason, from the model, the target, the host
and what the user asked. Real models (the zoo's SqueezeNet, an MLP, a sequence model) and real targets parsed
from their strings; no GPU needed, since a plan only decides."""

from __future__ import annotations

import json
import pickle

import onnx
import pytest
from onnx import TensorProto, helper

from onnxaccel.model import load_model
from onnxaccel.plan import Host, PlanRequest, padded_sizes, plan_execution
from onnxaccel.target import parse_target

H16 = Host(cores=16)


def _sequence_model(tmp_path) -> str:
    graph = helper.make_graph([helper.make_node("Identity", ["tokens"], ["same"])], "seq",
                              [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["N", "L"])],
                              [helper.make_tensor_value_info("same", TensorProto.FLOAT, ["N", "L"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "seq.onnx"))
    return str(tmp_path / "seq.onnx")


def test_serve_on_a_gpu_chooses_the_layout_and_graph_capture_from_the_cores():
    plan = plan_execution(parse_target("cuda/fp16"), PlanRequest(command="serve", max_batch=64), host=H16)
    assert (plan.workers, plan.shared_models, plan.instances) == (8, True, 4)
    assert plan.graph_capture and plan.target.option_dict["enable_cuda_graph"] == "1"
    assert plan.batch_sizes == padded_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert "captures by default" in plan.choice("graph_capture").reason
    small = plan_execution(parse_target("cuda"), PlanRequest(command="serve", max_batch=8), host=Host(cores=4))
    assert (small.workers, small.instances) == (2, 2)


def test_serve_with_instances_alone_keeps_the_chosen_processes_and_capture():
    """--instances 6 on a GPU: the default layout's workers and model process with six sessions, captured (it
    used to give one process without capture)."""
    plan = plan_execution(parse_target("cuda/fp16"), PlanRequest(command="serve", max_batch=64, instances=6),
                          host=H16)
    assert (plan.workers, plan.shared_models, plan.instances) == (8, True, 6)
    assert plan.graph_capture and plan.target.option_dict["enable_cuda_graph"] == "1"
    assert "6 instances (as given)" in plan.choice("layout").reason
    cpu = plan_execution(parse_target("cpu"), PlanRequest(command="serve", max_batch=8, instances=2), host=H16)
    assert (cpu.workers, cpu.shared_models, cpu.instances) == (1, False, 2)


def test_serve_fills_batches_where_several_gpu_instances_share_a_batcher():
    """The batch-forming policy is the plan's: fill for a GPU target's several instances (the chosen layout, or
    instances given), adaptive for one instance, a CPU target or Ray; a --queue-delay given wins; other commands
    have none."""
    def policy(target: str, **asked) -> str | None:
        return plan_execution(parse_target(target), PlanRequest(max_batch=64, **{"command": "serve", **asked}),
                              host=H16).queue_delay

    plan = plan_execution(parse_target("cuda/fp16"), PlanRequest(command="serve", max_batch=64), host=H16)
    assert plan.queue_delay == "fill" and plan.to_dict()["queue_delay"] == "fill"
    assert "4 instances" in plan.choice("queue_delay").reason and "--queue-delay adaptive" in plan.choice(
        "queue_delay").reason
    assert policy("cuda", workers=2, shared_models=True, instances=3) == "fill"
    assert policy("migraphx", instances=2) == "fill"
    assert policy("cuda", workers=2) == "adaptive"  # one instance: no batch runs beside another
    assert policy("cpu", instances=4) == "adaptive"
    assert policy("cuda", on_ray=True) == "adaptive"
    given = plan_execution(parse_target("cuda"), PlanRequest(command="serve", max_batch=64, queue_delay="adaptive"),
                           host=H16)
    assert given.queue_delay == "adaptive" and given.choice("queue_delay").reason.startswith("given")
    assert policy("cuda", command="batch") is None


def test_serve_cli_hands_the_plans_queue_delay_to_every_model():
    """cli/serve.py: --queue-delay not given lets the plan choose, and the models' defaults take the plan's value;
    given, it is the models' (the batcher runs ModelConfig.queue_delay)."""
    from types import SimpleNamespace

    from onnxaccel.cli.args_serve import BatcherArgs, LayoutArgs, SessionArgs
    from onnxaccel.cli.serve import _model_defaults

    def defaults(target: str, **batcher):
        values = {p.name: p.default for p in BatcherArgs().params()}
        flags = LayoutArgs().build(SimpleNamespace(**{p.name: p.default for p in LayoutArgs().params()}), None)
        session = SessionArgs().build(SimpleNamespace(**{p.name: p.default for p in SessionArgs().params()}), None)
        return _model_defaults(parse_target(target), None, SimpleNamespace(shapes={}, buckets=None),
                               SimpleNamespace(**{**values, "max_batch": 64, **batcher}), flags,
                               SimpleNamespace(preset=None, embed="auto"), session, False)

    assert BatcherArgs().params() and {p.name: p.default for p in BatcherArgs().params()}["queue_delay"] is None
    models, plan = defaults("cuda", instances=2)
    assert models.queue_delay == plan.queue_delay == "fill"
    models, plan = defaults("cuda", instances=2, queue_delay="adaptive")
    assert models.queue_delay == plan.queue_delay == "adaptive"
    models, plan = defaults("cpu")
    assert models.queue_delay == plan.queue_delay == "adaptive"


def test_serve_plans_the_instances_streams_and_drops_shared_where_it_cannot_apply():
    """streams: each instance a stream of its own unless --streams shared is given; shared only for several
    instances of a GPU provider that takes a caller's stream (its spec's stream_option), else dropped with the
    reason; None for one instance, a CPU target and other commands."""
    def plan(target: str, **asked):
        return plan_execution(parse_target(target), PlanRequest(max_batch=64, **{"command": "serve", **asked}),
                              host=H16)

    default = plan("cuda/fp16")
    assert default.streams == "own" and default.to_dict()["streams"] == "own"
    assert "--streams shared" in default.choice("streams").reason and "4 instances" in default.choice("streams").reason
    shared = plan("cuda/fp16", streams="shared")
    assert shared.streams == "shared" and shared.choice("streams").reason.startswith("given")
    assert not shared.notes
    assert "user_compute_stream" not in shared.target.option_dict  # an address of the model process, made there
    amd = plan("migraphx", instances=2, streams="shared")
    assert amd.streams == "own" and amd.choice("streams").overrides
    assert "MIGraphXExecutionProvider takes no caller's stream" in amd.notes[-1]
    own_stream = plan("cuda?user_compute_stream=1234", instances=2, streams="shared")
    assert own_stream.streams == "own" and "gives user_compute_stream itself" in own_stream.notes[-1]
    cpu = plan("cpu", instances=4, streams="shared")
    assert cpu.streams is None and "several instances of a GPU target" in cpu.notes[-1]
    assert plan("cuda", workers=2).streams is None  # one instance
    assert plan("cuda", command="batch").streams is None
    assert "--streams serial runs one at a time instead" in amd.notes[-1]


def test_serve_plans_serial_runs_for_any_gpu_provider_and_drops_them_where_they_cannot_apply(mlp_path):
    """--streams serial (streams of their own, one run at a time) needs no caller's stream: kept for several
    instances of any GPU provider, MIGraphX included, and handed to the instances' pool; dropped with the
    reason for a CPU target or one instance."""
    from onnxaccel.serve.config import ModelConfig
    from onnxaccel.serve.instance import ModelInstance

    def plan(target: str, **asked):
        return plan_execution(parse_target(target), PlanRequest(max_batch=64, **{"command": "serve", **asked}),
                              host=H16)

    for target in ("cuda/fp16", "migraphx"):
        serial = plan(target, instances=2, streams="serial")
        assert serial.streams == "serial" and serial.to_dict()["streams"] == "serial" and not serial.notes
        assert serial.choice("streams").reason.startswith("given")
    assert "--streams serial runs one at a time" in plan("cuda/fp16").choice("streams").reason
    cpu = plan("cpu", instances=4, streams="serial")
    assert cpu.streams is None and "--streams serial dropped" in cpu.notes[-1]
    assert plan("cuda", workers=2, streams="serial").streams is None
    on_ray = plan("cuda", instances=2, streams="serial", on_ray=True)  # a Ray replica is one process per instance
    assert on_ray.streams is None and "--streams serial dropped" in on_ray.notes[-1]
    config = ModelConfig(name="m", source="x.onnx", target="cuda", instances=2, streams="serial")
    model = load_model(str(mlp_path))
    assert ModelInstance._pool_settings(config, model, config.plan(model))["one_run_at_a_time"] is True
    own = ModelConfig(name="m", source="x.onnx", target="cuda", instances=2)
    assert ModelInstance._pool_settings(own, model, own.plan(model))["one_run_at_a_time"] is False


def test_serve_cli_hands_the_plans_streams_to_every_model_and_refuses_an_unknown_mode():
    from types import SimpleNamespace

    from onnxaccel.cli.args_serve import BatcherArgs, LayoutArgs, SessionArgs
    from onnxaccel.cli.serve import _model_defaults
    from onnxaccel.errors import UsageError
    from onnxaccel.serve.config import ModelConfig

    values = {p.name: p.default for p in BatcherArgs().params()}
    assert values["streams"] is None
    flags = LayoutArgs().build(SimpleNamespace(**{p.name: p.default for p in LayoutArgs().params()}), None)
    session = SessionArgs().build(SimpleNamespace(**{p.name: p.default for p in SessionArgs().params()}), None)
    batcher = BatcherArgs().build(SimpleNamespace(**{**values, "max_batch": 64, "instances": 2,
                                                     "streams": "shared"}), None)
    models, plan = _model_defaults(parse_target("cuda"), None, SimpleNamespace(shapes={}, buckets=None), batcher,
                                   flags, SimpleNamespace(preset=None, embed="auto"), session, False)
    assert models.streams == plan.streams == "shared"
    config = ModelConfig(name="m", source="x.onnx", target="cuda", instances=2, streams="shared")
    assert config.plan().streams == "shared"
    with pytest.raises(UsageError, match="not a stream mode"):
        BatcherArgs().build(SimpleNamespace(**{**values, "streams": "one"}), None)
    assert BatcherArgs().build(SimpleNamespace(**{**values, "streams": "serial"}), None).streams == "serial"
    with pytest.raises(UsageError, match="streams is 'one'"):
        ModelConfig(name="m", source="x.onnx", target="cuda", streams="one")


def test_serve_keeps_the_users_layout_and_the_cpu_one_process():
    given = plan_execution(parse_target("cuda"), PlanRequest(command="serve", max_batch=8, workers=2), host=H16)
    assert (given.workers, given.shared_models, given.instances) == (2, False, 1)
    assert not given.graph_capture and "enable_cuda_graph" not in given.target.option_dict
    cpu = plan_execution(parse_target("cpu"), PlanRequest(command="serve", max_batch=8), host=H16)
    assert (cpu.workers, cpu.instances, cpu.batch_sizes, cpu.graph_capture) == (1, 1, (), False)
    off = plan_execution(parse_target("cuda?enable_cuda_graph=0"), PlanRequest(command="serve", max_batch=8), host=H16)
    assert not off.graph_capture and off.target.option_dict["enable_cuda_graph"] == "0"


@pytest.mark.parametrize("target,key", [("cuda:0?enable_cuda_graph=1&prefer_nhwc=1", "enable_cuda_graph"),
                                        ("rocm?enable_hip_graph=1", "enable_hip_graph"),
                                        ("tensorrt?trt_cuda_graph_enable=True", "trt_cuda_graph_enable")])
def test_graph_capture_is_dropped_with_the_reason_for_a_model_whose_other_axes_vary(tmp_path, target, key):
    model = load_model(_sequence_model(tmp_path))
    plan = plan_execution(parse_target(target).with_precision("fp16"),
                          PlanRequest(command="serve", max_batch=8, auto_graph=False), model=model, host=H16)
    assert not plan.graph_capture and key not in plan.target.option_dict
    assert plan.precision == "fp16"
    if "prefer_nhwc" in target:
        assert plan.target.option_dict["prefer_nhwc"] == "1"  # the other tuned options stay
    assert any(key in n and "replays one shape" in n for n in plan.notes)


def test_graph_capture_is_kept_for_a_model_served_in_padded_sizes(mlp_path):
    plan = plan_execution(parse_target("cuda:0?enable_cuda_graph=1"), PlanRequest(command="serve", max_batch=8),
                          model=load_model(str(mlp_path)), host=H16)
    assert plan.graph_capture and not plan.notes
    one = plan_execution(parse_target("cuda:0?enable_cuda_graph=1"), PlanRequest(command="serve", max_batch=1),
                         model=load_model(str(mlp_path)), host=H16)
    assert not one.graph_capture and any("max_batch 1" in n for n in one.notes)


@pytest.mark.parametrize("target,threads", [("cuda:0", "1"), ("cuda:0?intra_op_num_threads=3", "3"), ("cpu", None)])
def test_gpu_sessions_get_one_cpu_thread_unless_the_target_sets_it(target, threads):
    plan = plan_execution(parse_target(target), PlanRequest(command="serve", max_batch=8, workers=1), host=H16)
    assert plan.target.option_dict.get("intra_op_num_threads") == threads


def test_arena_settings_go_to_the_providers_own_keys_or_say_they_do_nothing():
    request = PlanRequest(command="serve", max_batch=8, workers=1, arena_extend_strategy="kSameAsRequested",
                          gpu_mem_limit=1 << 30)
    cuda = plan_execution(parse_target("cuda"), request, host=H16).target.option_dict
    assert (cuda["arena_extend_strategy"], cuda["gpu_mem_limit"]) == ("kSameAsRequested", str(1 << 30))
    migraphx = plan_execution(parse_target("migraphx"), request, host=H16).target.option_dict
    assert migraphx["migraphx_arena_extend_strategy"] == "kSameAsRequested"
    cpu = plan_execution(parse_target("cpu"), request, host=H16)
    assert sum("no effect on cpu" in n for n in cpu.notes) == 2
    assert {c.name for c in plan_execution(parse_target("cuda"), request, host=H16).choices} >= {"arena_strategy",
                                                                                               "arena_limit"}


def test_batch_plans_its_batch_size_instances_waits_and_embedding():
    gpu = plan_execution(parse_target("cuda/fp16"), PlanRequest(command="batch", preprocess="imagenet",
                                                                input_kind="images"), host=H16)
    assert gpu.batch_sizes == (32,) and gpu.instances == 2
    assert (gpu.gpu_wait, gpu.gil_switch_ms, gpu.decoder) == ("block", 0.5, "auto")
    assert gpu.embed_preprocess == "imagenet"
    arrays = plan_execution(parse_target("cuda"), PlanRequest(command="batch", preprocess="imagenet",
                                                              input_kind="arrays"), host=H16)
    assert arrays.embed_preprocess is None
    cpu = plan_execution(parse_target("cpu"), PlanRequest(command="batch", preprocess="imagenet",
                                                          input_kind="images"), host=H16)
    assert (cpu.batch_sizes, cpu.instances, cpu.gpu_wait, cpu.embed_preprocess) == ((8,), 1, None, None)
    forced = plan_execution(parse_target("cpu"), PlanRequest(command="batch", embed_preprocess="yolo"), host=H16)
    assert forced.embed_preprocess == "yolo"


def test_the_plan_travels_and_prints_the_same_block_everywhere(mlp_path):
    plan = plan_execution(parse_target("cuda/fp16?prefer_nhwc=1"), PlanRequest(command="serve", max_batch=8),
                          model=load_model(str(mlp_path)), host=H16)
    assert pickle.loads(pickle.dumps(plan)) == plan  # to worker processes and Ray actors as a value
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["schema"] == "onnxaccel.plan/1" and data["target"] == str(plan.target)
    assert data["requested"] == "cuda/fp16?prefer_nhwc=1" and data["graph_capture"] is True
    names = [c["name"] for c in data["choices"]]
    assert names[0] == "target" and {"precision", "layout", "batch_sizes", "graph_capture", "session_threads"} <= set(names)
    lines = plan.lines()
    assert len(lines) == len(names) and lines[0].startswith("target: cuda/fp16?")
