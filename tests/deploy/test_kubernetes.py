"""The Kubernetes manifests validate against the Kubernetes JSON schemas (kubernetes-validate bundles them, so no
network is needed), and carry what a GPU inference server needs: amd.com/gpu, probes on the v2 health endpoints,
Prometheus scrape annotations, a non-root security context. The KServe InferenceService is checked against the
Kubernetes Container schema and, where the kserve SDK is installed, against the SDK's models. (Not applied to a
cluster: no cluster is reachable here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from model_builders import ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML (kubernetes-validate installs it)")

K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.33.0"


def documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def kv():
    return pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (bundles the schemas)")


@pytest.mark.parametrize("name", ["onnxaccel-amd.yaml", "onnxaccel-nvidia.yaml"])
def test_manifests_pass_strict_schema_validation(name):
    validate = kv()
    for doc in documents(name):
        validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises ValidationError with the path


def test_schema_validation_would_catch_a_typo():
    validate = kv()
    doc = documents("onnxaccel-amd.yaml")[0]
    doc["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(validate.ValidationError):
        validate.validate(doc, KUBERNETES_VERSION, strict=True)


def deployment(name: str) -> dict:
    return next(d for d in documents(name) if d["kind"] == "Deployment")


def test_amd_deployment_requests_a_gpu_and_probes_v2_health():
    pod = deployment("onnxaccel-amd.yaml")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["amd.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # first MIGraphX compile takes minutes
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["ONNXACCEL_TARGET"].startswith("migraphx")


def test_prometheus_scrapes_the_metrics_endpoint():
    pod = deployment("onnxaccel-amd.yaml")["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "8000",
                                              "prometheus.io/path": "/metrics"}
    service = next(d for d in documents("onnxaccel-amd.yaml") if d["kind"] == "Service")
    assert service["spec"]["selector"] == pod["metadata"]["labels"]
    assert {p["port"] for p in service["spec"]["ports"]} == {8000, 8001}


def test_pod_runs_non_root_with_the_device_groups():
    spec = deployment("onnxaccel-amd.yaml")["spec"]["template"]["spec"]
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001
    assert 44 in security["supplementalGroups"]  # video; render's GID is host-specific (commented in the file)
    assert spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["terminationGracePeriodSeconds"] > 30  # longer than serve's drain timeout


def test_nvidia_variant_asks_for_nvidia_gpus():
    (container,) = deployment("onnxaccel-nvidia.yaml")["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1, "memory": "16Gi"}
    assert container["image"].endswith(":cuda")


def inference_service() -> dict:
    (doc,) = documents("kserve-inferenceservice-amd.yaml")
    return doc


def test_inference_service_predictor_container_matches_the_kubernetes_container_schema():
    validate = kv()
    import jsonschema

    root = Path(validate.__file__).parent / "kubernetes-json-schema" / f"v{KUBERNETES_VERSION[:4]}.0-local-strict"
    if not root.is_dir():
        root = next(p for p in sorted((Path(validate.__file__).parent / "kubernetes-json-schema").iterdir())
                    if p.name.endswith("-local-strict"))
    definitions = json.loads((root / "_definitions.json").read_text())
    service = inference_service()
    assert (service["apiVersion"], service["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    predictor = service["spec"]["predictor"]

    def errors(value, definition: str) -> list[str]:
        validator = jsonschema.Draft202012Validator({**definitions, "$ref": f"#/$defs/{definition}"})
        return [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(value)]

    for container in predictor["containers"]:
        assert errors(container, "io.k8s.api.core.v1.Container") == []
    assert errors(predictor["securityContext"], "io.k8s.api.core.v1.PodSecurityContext") == []
    assert errors({**predictor["containers"][0], "readinessProbes": {}}, "io.k8s.api.core.v1.Container")


def test_inference_service_serves_v2_on_the_port_kserve_routes_to():
    service = inference_service()
    (container,) = service["spec"]["predictor"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert container["ports"] == [{"containerPort": 8080, "protocol": "TCP"}] and env["ONNXACCEL_HTTP_PORT"] == "8080"
    assert env["ONNXACCEL_MODEL"] == "/mnt/models" and env["STORAGE_URI"].startswith("pvc://")
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["resources"]["limits"]["amd.com/gpu"] == 1
    assert service["metadata"]["annotations"]["prometheus.io/port"] == "8080"


def kserve_python() -> str | None:
    """A Python with the kserve SDK: ONNXACCEL_KSERVE_PYTHON, /tmp/kserve-venv (as tests/serve uses), or this one."""
    import importlib.util

    if importlib.util.find_spec("kserve") is not None:
        return sys.executable
    candidate = os.environ.get("ONNXACCEL_KSERVE_PYTHON", "/tmp/kserve-venv/bin/python")
    return candidate if Path(candidate).exists() else None


def test_inference_service_matches_the_kserve_sdk_models(tmp_path):
    python = kserve_python()
    if python is None:
        pytest.skip("no Python with the kserve SDK: set ONNXACCEL_KSERVE_PYTHON (see tests/serve/test_kserve_sdk.py)")
    script = Path(__file__).with_name("kserve_structure.py")
    good = subprocess.run([python, str(script), str(K8S / "kserve-inferenceservice-amd.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["problems"] == []
    broken = tmp_path / "broken.yaml"
    doc = inference_service()
    doc["spec"]["predictor"]["minReplica"] = 1
    broken.write_text(yaml.safe_dump(doc))
    bad = json.loads(subprocess.run([python, str(script), str(broken)], capture_output=True, text=True,
                                    timeout=120).stdout)
    assert bad["problems"] == ["$.spec.predictor.minReplica: not a field of V1beta1PredictorSpec"]


@pytest.mark.parametrize(("name", "gpu"), [("onnxaccel-amd.yaml", "amd.com/gpu"),
                                           ("onnxaccel-nvidia.yaml", "nvidia.com/gpu")])
def test_an_init_container_compiles_ahead_and_the_server_starts_from_it_read_only(name, gpu):
    """issue 36: `onnxaccel compile` (the entrypoint's `compile` mode) fills /artifacts; the server reads it through
    ONNXACCEL_ARTIFACTS, mounted read-only; both on the same image and GPU kind, with the same target."""
    spec = deployment(name)["spec"]["template"]["spec"]
    (init,), (server,) = spec["initContainers"], spec["containers"]
    assert init["args"] == ["compile"] and init["image"] == server["image"]
    init_env = {e["name"]: e["value"] for e in init["env"]}
    server_env = {e["name"]: e["value"] for e in server["env"]}
    assert init_env == server_env and server_env["ONNXACCEL_ARTIFACTS"] == "/artifacts"
    mounts = {c["name"]: {m["name"]: m for m in c["volumeMounts"]} for c in (init, server)}
    assert mounts["compile"]["artifacts"]["mountPath"] == "/artifacts" and not mounts["compile"]["artifacts"].get(
        "readOnly")
    assert mounts[server["name"]]["artifacts"] == {"name": "artifacts", "mountPath": "/artifacts", "readOnly": True}
    assert init["resources"]["limits"][gpu] == server["resources"]["limits"][gpu] == 1
    assert {"name": "artifacts", "emptyDir": {"sizeLimit": "20Gi"}} in spec["volumes"]
