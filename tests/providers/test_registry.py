"""The provider registry: one module per execution provider, and a provider added in one place (here, a toy
registered by this file alone) is seen by target parsing, ``onnxaccel doctor``, ``best_target`` and the plan."""

from __future__ import annotations

import dataclasses
import json

import pytest

from onnxaccel import providers
from onnxaccel.errors import ProviderOptionError, TargetError
from onnxaccel.providers import ProviderSpec
from onnxaccel.target import parse_target

TOY = ProviderSpec(
    device="toyep",
    provider="ToyExecutionProvider",
    package=("onnxruntime-toy", "toy"),
    is_gpu=False,
    options={"toy_opt": "int", "toy_mode": ("fast", "exact")},
    device_id_option=None,
    preference=0,
    doctor_default=True,
    sources=("example/toy-runtime src/toy_provider.cc @0000000 (a test's provider)",),
)


@pytest.fixture
def toy():
    providers.register(TOY)
    yield TOY
    providers.unregister(TOY.device)


def test_the_built_in_providers_are_registered_in_order():
    assert providers.devices() == ("cpu", "cuda", "tensorrt", "migraphx", "rocm")
    assert [s.device for s in providers.by_preference()] == ["migraphx", "cuda", "cpu"]
    assert providers.get("cuda").provider == "CUDAExecutionProvider"
    assert providers.get("cuda").graph_option == "enable_cuda_graph" and providers.get("cuda").graph_by_default
    assert providers.get("migraphx").arena_keys == ("migraphx_arena_extend_strategy", "migraphx_mem_limit")
    assert providers.get("tensorrt").arena_keys == (None, None)
    assert [s.device for s in providers.all_specs() if s.compiles_per_shape] == ["cuda", "tensorrt", "migraphx"]
    assert all(spec.sources for spec in providers.all_specs())


def test_an_unknown_device_is_a_target_error_with_the_closest_one():
    with pytest.raises(TargetError) as err:
        providers.get("cdua")
    assert "Did you mean 'cuda'" in err.value.hint


def test_a_spec_may_not_name_an_option_its_table_lacks():
    with pytest.raises(ValueError, match="not in the option table"):
        ProviderSpec(device="bad", provider="BadExecutionProvider", package=("x", "y"), graph_option="missing")


def test_specs_are_frozen_and_their_tables_read_only():
    spec = providers.get("cuda")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.provider = "other"
    with pytest.raises(TypeError):
        spec.options["new_key"] = "int"


def test_registering_a_device_again_replaces_it_in_place(toy):
    providers.register(dataclasses.replace(toy, options={"toy_opt": "int"}))
    assert providers.devices()[-1] == "toyep" and providers.devices().count("toyep") == 1
    assert set(providers.get("toyep").options) == {"toy_opt"}


def test_a_toy_provider_parses_as_a_target_and_refuses_unknown_options_with_its_keys(toy):
    target = parse_target("toyep?toy_opt=1&toy_mode=EXACT")
    assert target.provider == "ToyExecutionProvider" and not target.is_gpu
    assert target.provider_options() == {"toy_mode": "exact", "toy_opt": "1"}
    assert str(target) == "toyep?toy_mode=exact&toy_opt=1"
    with pytest.raises(ProviderOptionError) as err:
        parse_target("toyep?prefer_nhwc=1")
    assert "not an option of ToyExecutionProvider (it is a cuda option)" in err.value.message
    assert "toy_mode, toy_opt" in err.value.hint
    with pytest.raises(TargetError, match="takes no device id"):
        parse_target("toyep:0")
    with pytest.raises(TargetError, match="Targets: cpu, cuda, tensorrt, migraphx, rocm, toyep"):
        parse_target("nosuch")


def test_without_the_toy_its_target_is_unknown():
    with pytest.raises(TargetError, match="Unknown target device 'toyep'"):
        parse_target("toyep")


def test_doctor_lists_the_toy_provider_and_says_what_brings_it(toy, monkeypatch):
    from onnxaccel.system.doctor import run_doctor

    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    report = run_doctor()
    data = json.loads(json.dumps(report.to_dict()))
    listed = {p["device"]: p for p in data["providers"]}
    assert listed["toyep"]["provider"] == "ToyExecutionProvider" and listed["toyep"]["built"] is False
    assert set(listed) >= {"cpu", "cuda", "tensorrt", "migraphx", "rocm"}
    verdict = report.verdict("toyep")
    assert verdict is not None and not verdict.ready
    assert "ToyExecutionProvider is not part of the installed ONNX Runtime" in verdict.cause
    assert "onnxruntime-toy" in verdict.fix
    assert report.verdict("cpu").ready  # the toy does not change the others

    requested = run_doctor("toyep")
    assert [v.target for v in requested.targets] == ["toyep"] and not requested.ok


def test_best_target_tries_the_toy_first_and_skips_it_with_the_reason(toy):
    from onnxaccel.engines import best_target

    best, skipped = best_target()
    assert str(best) == "cpu"
    assert skipped[0].startswith("toyep: ToyExecutionProvider is not part of the installed ONNX Runtime")
    assert "onnxruntime-toy" in skipped[0]


def test_the_plan_reads_the_toy_providers_spec(toy):
    plan_module = pytest.importorskip("onnxaccel.plan")
    plan = plan_module.plan_execution(parse_target("toyep?toy_opt=2"), plan_module.PlanRequest(command="run"))
    assert plan.target.device == "toyep" and plan.target.option_dict["toy_opt"] == "2"
    assert not plan.graph_capture


def test_the_doctor_command_takes_the_toy_as_a_target_and_lists_it(toy):
    from typer.testing import CliRunner

    from onnxaccel.cli.main import app

    result = CliRunner().invoke(app, ["doctor", "--json", "--target", "toyep?toy_opt=1"])
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and data["requested"] == "toyep?toy_opt=1"
    assert [v["provider"] for v in data["targets"]] == ["ToyExecutionProvider"]
    assert "toyep" in {p["device"] for p in data["providers"]}


TOY_GPU = ProviderSpec(
    device="toygpu",
    provider="ToyGpuExecutionProvider",
    package=("onnxruntime-toy", "toy"),
    options={"toy_graph": "bool", "toy_search": ("slow", "fast"), "toy_cache": "str", "toy_int8": "bool",
             "toy_table": "str", "toy_native": "bool"},
    graph_option="toy_graph",
    tuning=(providers.Knob("toy search", ({"toy_search": "fast"},)), providers.Knob("graph capture", graph=True)),
    compile_cache=providers.CompileCache("toy", "programs", "*.toy", {"toy_cache": "{dir}"}),
    calibration_options=("toy_int8", "toy_table", "toy_native"),
    sources=("example/toy-runtime src/toy_gpu.cc @0000000 (a test's provider)",),
)


@pytest.fixture
def toy_gpu():
    providers.register(TOY_GPU)
    yield TOY_GPU
    providers.unregister(TOY_GPU.device)


def test_a_toy_gpu_provider_is_tuned_cached_and_calibrated_through_its_spec_alone(toy_gpu, tmp_path):
    from onnxaccel.bench.tune_space import stages_for
    from onnxaccel.transform.calibration_table import write_table
    from onnxaccel.transform.compile_cache import _cache_options, cache_kind

    target = parse_target("toygpu")
    stages = stages_for(target)
    assert [s.name for s in stages] == ["toy search", "graph capture (toy_graph)"]
    assert stages[1].needs_iobinding and stages[1].variants == ({"toy_graph": "1"},)
    assert cache_kind(target) == "toy" and "toy_cache" in _cache_options()
    assert toy_gpu.compile_cache.options_for("/c") == {"toy_cache": "/c"}
    table = write_table({"x": 1.0}, tmp_path, target, native=False)
    assert table.options == {"toy_int8": "1", "toy_table": str(table.path.resolve()), "toy_native": "0"}
    assert "toy_graph" in providers.graph_options()


def test_a_spec_may_not_name_a_tuning_or_cache_option_its_table_lacks():
    with pytest.raises(ValueError, match="not in the option table"):
        ProviderSpec(device="bad", provider="BadExecutionProvider", package=("x", "y"),
                     tuning=(providers.Knob("k", ({"nope": "1"},)),))
    with pytest.raises(ValueError, match="not in the option table"):
        ProviderSpec(device="bad", provider="BadExecutionProvider", package=("x", "y"),
                     compile_cache=providers.CompileCache("c", "f", "*", {"nope": "{dir}"}))
