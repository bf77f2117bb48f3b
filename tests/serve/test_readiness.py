"""While a server starts, GET /v2/health/ready says why it is not ready yet: the server's state and each model's
state and reason, a loading model's reason naming the step it is at (reading, building N instances, warming at
the padded sizes). Real ModelRepository and InferenceService on a real model; the HTTP body through a real server
in tests/serve (conftest's server fixture) for the ready case."""

from __future__ import annotations

import asyncio

import httpx

import onnxaccel.serve.repository as repository_module
from onnxaccel.serve.config import ModelConfig, ServerConfig
from onnxaccel.serve.core import InferenceService
from onnxaccel.serve.metrics import ServerMetrics
from onnxaccel.serve.repository import ModelRepository, load_instance


def test_load_instance_reports_each_step(mlp_path):
    steps = []
    instance = load_instance(ModelConfig(name="mlp", source=str(mlp_path), target="cpu", instances=2), steps.append)
    instance.close()
    assert steps == ["loading: reading the model", "loading: building 2 instance(s)", "loading: warming 2 instance(s)"]


def test_readiness_says_starting_and_the_step_each_model_is_at(mlp_path, monkeypatch):
    repository = ModelRepository(str(mlp_path), ModelConfig(name="", source="", target="cpu"))
    service = InferenceService(repository, ServerMetrics(), ServerConfig())
    seen = []
    real = repository_module.load_instance

    def watched(config, progress):
        def step(text):
            progress(text)
            seen.append(service.readiness())
        return real(config, step)

    monkeypatch.setattr(repository_module, "load_instance", watched)
    before = service.readiness()
    assert before["ready"] is False and before["state"] == "starting"
    assert before["models"] == [{"name": "mlp", "version": "1", "state": "UNAVAILABLE", "reason": "not loaded"}]

    async def load_check_unload():
        await repository.load("mlp")
        service.loaded = True
        try:
            ready = service.readiness()
            service.draining = True
            return ready, service.readiness()["state"]
        finally:
            await repository.unload("mlp")

    ready, draining = asyncio.run(load_check_unload())
    assert [s["models"][0]["reason"] for s in seen] == ["loading: reading the model",
                                                        "loading: building 1 instance(s)",
                                                        "loading: warming 1 instance(s)"]
    assert {s["state"] for s in seen} == {"starting"} and {s["models"][0]["state"] for s in seen} == {"LOADING"}
    assert ready == {"ready": True} and draining == "draining"


def test_with_a_token_the_public_probe_names_no_model(mlp_path):
    repository = ModelRepository(str(mlp_path), ModelConfig(name="", source="", target="cpu"))
    service = InferenceService(repository, ServerMetrics(), ServerConfig(auth_token="secret"))
    assert service.readiness() == {"ready": False, "state": "starting"}


def test_the_ready_endpoint_answers_with_its_body(server):
    response = httpx.get(f"{server.url}/v2/health/ready")
    assert response.status_code == 200 and response.json() == {"ready": True}
