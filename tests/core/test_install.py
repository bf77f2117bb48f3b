"""Fix commands that are right for how onnxaccel was installed (issue 23): one test per install mode, with
real importlib.metadata distributions (this checkout's editable install, and dist-info folders written the
way pip writes them: PEP 610 direct_url.json for local installs, none for the index)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from model_builders import ROOT
from onnxaccel.errors import MissingDependencyError
from onnxaccel.install import describe, install_mode


def _dist(tmp_path: Path, direct_url: dict | None) -> metadata.Distribution:
    info = tmp_path / "onnxaccel-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxaccel\nVersion: 0.1.0\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    return metadata.PathDistribution(info)


def test_editable_checkout_this_one():
    """How this test suite runs (`make test`: pip install -e .): the fix installs this checkout, editable."""
    mode = install_mode(markers=())
    assert mode.kind == "editable"
    assert Path(mode.location).resolve() == ROOT.resolve()
    command = mode.install("cuda")
    assert command == f"{sys.executable} -m pip install -e '{mode.location}[cuda]'"
    assert "'onnxaccel[cuda]'" not in command


def test_index_install(tmp_path):
    mode = install_mode(_dist(tmp_path, None), markers=())
    assert mode.kind == "index"
    assert mode.install("migraphx").endswith("-m pip install 'onnxaccel[migraphx]'")
    assert "-e" not in mode.install("migraphx").split()


def test_local_directory_not_editable(tmp_path):
    mode = install_mode(_dist(tmp_path, {"url": "file:///opt/src/onnx%20accel", "dir_info": {}}), markers=())
    assert (mode.kind, mode.location) == ("local", "/opt/src/onnx accel")
    assert mode.install("cpu").endswith("-m pip install '/opt/src/onnx accel[cpu]'")


def test_vcs_url_falls_back_to_the_index(tmp_path):
    dist = _dist(tmp_path, {"url": "https://example.invalid/onnxaccel.git", "vcs_info": {"vcs": "git"}})
    assert install_mode(dist, markers=()).kind == "index"


def test_container_is_said_once_not_inside_commands(tmp_path):
    marker = tmp_path / ".dockerenv"
    marker.touch()
    mode = install_mode(_dist(tmp_path, None), markers=(marker,))
    assert mode.container
    assert "container" not in mode.install("cuda")  # commands stay copy-pasteable
    assert "container" in describe(mode)


def test_source_tree_without_install():
    """Run from src on PYTHONPATH with no onnxaccel installed (python -S: no site-packages): install the
    checkout, editable."""
    script = ("import importlib.util, sys\n"
              f"spec = importlib.util.spec_from_file_location('install', {str(ROOT / 'src/onnxaccel/install.py')!r})\n"
              "m = importlib.util.module_from_spec(spec); sys.modules['install'] = m; spec.loader.exec_module(m)\n"
              "mode = m.install_mode(markers=())\nprint(mode.kind, mode.location, sep='|')\n"
              "print(mode.install('cuda'))")
    out = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, check=True).stdout
    kind, location = out.splitlines()[0].split("|")
    assert kind == "source" and Path(location).resolve() == ROOT.resolve()
    assert f"pip install -e '{location}[cuda]'" in out.splitlines()[1]


def test_missing_dependency_hint_installs_this_way():
    error = MissingDependencyError("onnxslim", "optimize", "Simplifying")
    assert error.hint == install_mode().install("optimize")


@pytest.mark.parametrize("target", ["cuda", "migraphx"])
def test_doctor_fix_for_a_missing_provider(target):
    """doctor --target cuda on this CPU-only install: the fix swaps the runtime and installs THIS checkout
    (before: `pip install 'onnxaccel[cuda]'`, which is not on the index and left no runtime at all)."""
    out = subprocess.run([str(Path(sys.executable).parent / "onnxaccel"), "doctor", "--target", target, "--json"],
                         capture_output=True, text=True, cwd=ROOT)
    report = json.loads(out.stdout)
    fix = report["targets"][0]["fix"]
    assert f"-m pip install -e '{install_mode().location}[" in fix, fix
    assert "'onnxaccel[" not in fix
    assert any(f["code"] == "onnxaccel-install" and "checkout" in f["title"] for f in report["findings"])
