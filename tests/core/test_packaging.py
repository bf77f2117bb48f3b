"""The extras choose exactly one ONNX Runtime build; no core dependency drags one in."""

from __future__ import annotations

import re
from importlib import metadata

import pytest

from model_builders import ROOT
from onnxaccel.engines.ort import ORT_DISTRIBUTIONS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


def test_core_dependencies_include_no_onnxruntime_build():
    assert not {_name(r) for r in PROJECT["dependencies"]} & set(ORT_DISTRIBUTIONS)


@pytest.mark.parametrize("extra,build", [("cpu", "onnxruntime"), ("cuda", "onnxruntime-gpu"),
                                         ("migraphx", "onnxruntime-migraphx"), ("rocm", "onnxruntime-rocm")])
def test_each_runtime_extra_pulls_exactly_its_own_build(extra, build):
    builds = [_name(r) for r in PROJECT["optional-dependencies"][extra] if _name(r) in ORT_DISTRIBUTIONS]
    assert builds == [build]


def test_rocm_extra_is_capped_below_the_release_that_removed_the_rocm_ep():
    (req,) = PROJECT["optional-dependencies"]["rocm"]
    assert "<1.23" in req


def test_no_other_extra_pulls_an_onnxruntime_build():
    for extra, reqs in PROJECT["optional-dependencies"].items():
        if extra in ("cpu", "cuda", "migraphx", "rocm"):
            continue
        assert not {_name(r) for r in reqs} & set(ORT_DISTRIBUTIONS), extra


def test_installed_core_dependencies_do_not_require_onnxruntime_transitively():
    seen, todo = set(), [_name(r) for r in PROJECT["dependencies"]]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for req in metadata.requires(name) or []:
            if "extra ==" not in req:
                todo.append(_name(req))
    assert not seen & set(ORT_DISTRIBUTIONS), sorted(seen & set(ORT_DISTRIBUTIONS))
