"""Only onnxaccel.providers (and engines/, which applies the options) names a provider's options or its ONNX
Runtime name: scripts/check_provider_names.py runs in CI through here.

Modules that still do are listed in the script's ALLOWED with the reason; a NEW one fails at once, and an
entry whose module names nothing any more fails too, so the list only shrinks.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check_provider_names.py"


def _checker():
    spec = importlib.util.spec_from_file_location("check_provider_names_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_module_outside_providers_and_engines_names_a_provider_except_the_allowed_ones():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_every_allowed_entry_has_a_reason():
    checker = _checker()
    assert all(reason.strip() for reason in checker.ALLOWED.values())


def test_the_checker_finds_keys_and_provider_names_in_code_not_in_docstrings(tmp_path):
    checker = _checker()
    root = tmp_path / "onnxaccel"
    files = {
        "serve/knobs.py": '"""Docstrings may say prefer_nhwc or CUDAExecutionProvider."""\n'
                          'GRAPH = "enable_cuda_graph"\n',
        "bench/names.py": 'def f(p):\n    """CUDAExecutionProvider here is fine."""\n'
                          '    return p == "ROCMExecutionProvider"\n',
        "report.py": 'ROW = {"device_id": 0, "label": f"x{1}"}  # device_id is too generic to count\n'
                     '# prefer_nhwc in a comment does not count\n',
        "engines/ort.py": 'OPT = "prefer_nhwc"\n',
        "providers/cuda.py": 'PROVIDER = "CUDAExecutionProvider"\n',
        "cli/old.py": "X = 1\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    keys = frozenset({"prefer_nhwc", "enable_cuda_graph"})
    assert checker.offenders(root, keys) == {"serve/knobs.py": ["enable_cuda_graph"],
                                             "bench/names.py": ["ROCMExecutionProvider"]}
    problems = checker.check(root, {"bench/names.py": "to move", "cli/old.py": "to move"}, keys)
    assert len(problems) == 2
    assert problems[0].startswith("serve/knobs.py: names enable_cuda_graph")
    assert problems[1].startswith("cli/old.py: in ALLOWED but names no provider option")


def test_the_checker_reads_the_keys_from_the_registry_so_a_new_provider_counts(tmp_path):
    from onnxaccel import providers
    from onnxaccel.providers import ProviderSpec

    checker = _checker()
    assert "enable_cuda_graph" in checker.option_keys() and "device_id" not in checker.option_keys()
    providers.register(ProviderSpec(device="namesprobe", provider="NamesProbeExecutionProvider",
                                    package=("onnxruntime", "cpu"), options={"namesprobe_knob": "int"}))
    try:
        assert "namesprobe_knob" in checker.option_keys()
    finally:
        providers.unregister("namesprobe")
