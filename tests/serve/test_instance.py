"""A served model: its signature (the runner's feed check worded for the protocol), its padding policy and
graph-capture rules, its pool built and warmed in the pool's own threads, the model process's pool settings,
and uvicorn's body high-water mark. The pool itself is tested in tests/engines/test_pool.py."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from onnxaccel.model import load_model
from onnxaccel.serve.config import ModelConfig, ServerConfig, model_defaults
from onnxaccel.plan import fixed_shapes_but_batch
from onnxaccel.serve.instance import ModelInstance
from onnxaccel.serve.protocol import InferRequest, ProtocolError
from onnxaccel.target import parse_target


def test_body_high_water_is_raised_for_httptools():
    httptools_impl = pytest.importorskip("uvicorn.protocols.http.httptools_impl")
    from onnxaccel.serve.server import BODY_HIGH_WATER, _raise_body_high_water

    before = httptools_impl.HIGH_WATER_LIMIT
    try:
        _raise_body_high_water(64 * 2**20)
        assert httptools_impl.HIGH_WATER_LIMIT == max(before, BODY_HIGH_WATER)
        _raise_body_high_water(1024)  # never lowered below what is set
        assert httptools_impl.HIGH_WATER_LIMIT == max(before, BODY_HIGH_WATER)
    finally:
        httptools_impl.HIGH_WATER_LIMIT = before


# The target a model is served with (graph capture, session threads, arena options) is its plan's:
# tests/core/test_plan.py.


def test_graph_capture_needs_every_axis_but_the_batch_fixed(tmp_path, mlp_path):
    import onnx
    from onnx import TensorProto, helper

    assert fixed_shapes_but_batch(load_model(str(mlp_path)))
    graph = helper.make_graph([helper.make_node("Identity", ["tokens"], ["same"])], "seq",
                              [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["N", "L"])],
                              [helper.make_tensor_value_info("same", TensorProto.FLOAT, ["N", "L"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "seq.onnx"))
    assert not fixed_shapes_but_batch(load_model(str(tmp_path / "seq.onnx")))


def _request(**inputs) -> InferRequest:
    return InferRequest(model_name="mlp", inputs=inputs,
                        datatypes={k: {"float32": "FP32", "int64": "INT64"}[str(v.dtype)] for k, v in inputs.items()})


@pytest.fixture()
def mlp_instance(mlp_path):
    from onnxaccel.serve.repository import load_instance

    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=16))
    yield instance
    instance.close()


@pytest.mark.parametrize("inputs,message", [
    ({"y": np.zeros((1, 4), np.float32)}, "Model 'mlp' has no input named 'y'; its inputs are: x."),
    ({}, "The request has no value for input(s) x of model 'mlp'."),
    ({"x": np.zeros((1, 4), np.int64)}, "Input 'x' of model 'mlp' is FP32; the request sends INT64."),
    ({"x": np.zeros((4,), np.float32)}, "Input 'x' of model 'mlp' has rank 2 [-1, 4]; the request sends shape [4]."),
    ({"x": np.zeros((1, 5), np.float32)},
     "Input 'x' of model 'mlp' must have 4 on axis 1 (shape [-1, 4]); the request sends shape [1, 5]."),
    ({"x": np.zeros((17, 4), np.float32)},
     "Input 'x' has batch 17, above the model's max_batch 16; split the request."),
])
def test_requests_are_checked_by_the_runners_rules_in_the_protocols_words(mlp_instance, inputs, message):
    with pytest.raises(ProtocolError) as err:
        mlp_instance.validate(_request(**inputs))
    assert err.value.status == 400 and err.value.message == message


def test_a_valid_request_gives_its_feeds_and_rows(mlp_instance):
    x = np.ones((3, 4), np.float32)
    feeds, rows = mlp_instance.validate(_request(x=x))
    assert rows == 3 and feeds["x"] is x


def test_the_padded_size_comes_from_the_pool(mlp_instance):
    mlp_instance.buckets = (1, 2, 4, 8, 16)
    assert mlp_instance.pool.buckets == (1, 2, 4, 8, 16)
    assert [mlp_instance.pool.bucket(n) for n in (1, 3, 5, 9, 16, 20)] == [1, 4, 8, 16, 16, 20]
    assert mlp_instance.padding_share(5) == pytest.approx(3 / 8)


def test_start_builds_each_instance_and_its_size_sessions_in_the_thread_that_runs_it(mlp_path):
    """ModelInstance.start: the factory runs in each instance's own run thread (the one batches go to), one
    session per padded size there; warm-up runs in that thread too."""
    from onnxaccel.pipeline import compile_only

    model, target = load_model(str(mlp_path)), parse_target("cpu")
    compiled = compile_only(model, target, batch=1)
    made = []

    def make():
        made.append(threading.current_thread().name)
        return compiled.new_runner()

    config = ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=4, instances=2)
    instance = ModelInstance.start(config, compiled.model, config.plan(compiled.model), make, ["a note"])
    try:
        assert made == ["run-mlp-0_0", "run-mlp-1_0"]  # one runner each: no padded sizes on a CPU
        assert instance.warnings == ["a note"] and len(instance.runners) == 2 and instance.size_runners == []
        instance.buckets = (1, 2, 4)  # as on a GPU; the warm-up runs in each instance's thread
        seen = []
        real = instance.pool._execute

        def spy(index, feeds, **how):
            seen.append((index, threading.current_thread().name, next(iter(feeds.values())).shape[0]))
            return real(index, feeds, **how)

        instance.pool._execute = spy
        assert instance.warm_up() == [1, 2, 4]
        assert sorted(seen) == sorted((i, f"run-mlp-{i}_0", size) for i in (0, 1) for size in (1, 2, 4))
    finally:
        instance.close()
        compiled.close()


def test_start_with_a_session_per_size_builds_them_in_the_instance_thread(mlp_path, monkeypatch):
    """On a GPU target (here: the CPU runner standing in, buckets from a GPU target's policy)."""
    from onnxaccel.pipeline import compile_only

    model, target = load_model(str(mlp_path)), parse_target("cpu")
    compiled = compile_only(model, target, batch=1)
    made = []

    def make():
        made.append(threading.current_thread().name)
        return compiled.new_runner()

    monkeypatch.setattr(ModelInstance, "_pool_settings", staticmethod(
        lambda config, model, target: {"model": model, "buckets": (1, 2, 4), "graph": False,
                                       "arena_shrinkage": False, "name": config.name}))
    config = ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=4, instances=1)
    instance = ModelInstance.start(config, compiled.model, config.plan(compiled.model), make)
    try:
        assert made == ["run-mlp-0_0"] * 3 and sorted(instance.size_runners[0]) == [1, 2, 4]
        assert instance.size_runners[0][1] is instance.runners[0]
        outputs, _ = instance.execute_joined(0, [{"x": np.ones((1, 4), np.float32)}] * 3)  # the size-4 session
        assert outputs["probs"].shape[0] == 3
    finally:
        instance.close()
        compiled.close()


def test_the_model_process_joins_batches_without_holding_the_gil(mlp_path, tmp_path):
    """A pool setting, set on the pools of the models the model process loads (no global changed from
    outside); a server of its own keeps the GIL-holding join."""
    from onnxaccel.serve.model_host import ModelHost
    from onnxaccel.serve.repository import ModelRepository

    async def scenario():
        host = ModelHost(str(mlp_path), model_defaults({"target": "cpu"}), ServerConfig(), str(tmp_path / "sock"), None)
        host.repository = ModelRepository(str(mlp_path), {"target": "cpu", "max_batch": 4})
        await host.repository.load_all()
        (entry,) = host.repository.entries.values()
        before = entry.instance.pool.join_holds_gil
        host._release_gil_in_joins()
        after = entry.instance.pool.join_holds_gil
        await host.repository.close()
        return before, after

    assert asyncio.run(scenario()) == (True, False)


def test_a_shared_stream_is_named_in_the_sessions_target_or_dropped_with_the_runtimes_reason():
    """--streams shared: the model process makes one stream and builds every session with it in the provider's
    stream_option; where the CUDA runtime refuses (this machine: no driver), the instances keep their own streams,
    and the plan (what reports print) says own, with the runtime's reason."""
    from onnxaccel.plan import Host, PlanRequest, plan_execution
    from onnxaccel.serve.repository import _shared_stream

    plan = plan_execution(parse_target("cuda:0"), PlanRequest(command="serve", max_batch=64, streams="shared"),
                          host=Host(cores=16))
    assert plan.streams == "shared"
    stream, ran, served = _shared_stream(plan)
    if stream is None:
        assert served == plan.target and ran.streams == "own" and ran.to_dict()["streams"] == "own"
        said = ran.choice("streams")
        assert said.overrides and said.reason.startswith("--streams shared dropped, each instance keeps a stream")
        assert "cudaStreamCreateWithFlags failed" in said.reason or "libcudart" in said.reason, said.reason
        assert said.reason in ran.notes
    else:  # a machine with a GPU
        try:
            assert ran is plan and stream.handle
            assert served.option_dict["user_compute_stream"] == str(stream.handle)
            assert served.option_dict["enable_cuda_graph"] == "1"
            assert "user_compute_stream" not in ran.target.option_dict
        finally:
            stream.close()
        assert stream.handle == 0


def test_a_cpu_model_asked_to_share_a_stream_says_why_not_and_closes_cleanly(mlp_path):
    from onnxaccel.serve.repository import load_instance

    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", max_batch=4,
                                         instances=2, streams="shared"))
    try:
        assert instance.plan.streams is None and instance.stream is None
        assert any("--streams shared dropped" in w for w in instance.warnings), instance.warnings
    finally:
        instance.close()

    class Stream:  # a device stream cannot exist here: what close() must do with one
        closed = 0

        def close(self):
            self.closed += 1

    stream = instance.stream = Stream()
    instance.pool.close = lambda: None  # closed above
    instance.close()
    assert stream.closed == 1 and instance.stream is None
