"""A target is parsed from text once, where text enters (a flag, a config.json, a tune configuration, a report or
cache file read back, a Python caller's string), and travels as a Target from there (docs/ARCHITECTURE.md,
"The plan"). Statically: every call of parse_target outside target.py is in a module listed here with its reason,
so a new parse on the way from a flag to a session fails. Dynamically: serving and a batch job given a Target parse
no target text at all on their way to the sessions."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src" / "onnxaccel"

#: Modules that turn text into a Target, and where that text comes from. Only shrinks or changes with a reason.
TEXT_ENTERS = {
    "cli/common.py": "the --target flag (resolve_target, with auto)",
    "cli/groups.py": "the --target flag against a --config's Target",
    "serve/config.py": "a model's config.json (or a mapping from the Python API), once per ModelConfig",
    "scale/job.py": "BatchJob.target given as text from Python, once per job",
    "bench/config.py": "a tune configuration file",
    "bench/cells.py": "a bench report's cells read back for --resume",
    "bench/accuracy.py": "the reference target named by --reference",
    "transform/compile_cache.py": "a compile cache's key file read back",
    "transform/gate_report.py": "a report's run_with read back",
    "transform/gate.py": "the CPU reference, a constant",
    "analysis/kernels.py": "a spec dict handed to a subprocess",
    "system/doctor.py": "doctor --target text, and the device names it probes",
    "engines/__init__.py": "best_target: a provider's device name",
}


def _parse_calls(path: Path) -> int:
    tree = ast.parse(path.read_text())
    return sum(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "parse_target"
               for n in ast.walk(tree))


def test_target_text_is_parsed_only_where_it_enters():
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel != "target.py" and _parse_calls(path):
            found[rel] = True
    new = sorted(set(found) - set(TEXT_ENTERS))
    assert not new, f"parse_target called in {new}: pass the Target on instead (or list where the text enters)"
    gone = sorted(set(TEXT_ENTERS) - set(found))
    assert not gone, f"no longer parse a target, remove from TEXT_ENTERS: {gone}"


def _counting(monkeypatch) -> list[str]:
    from onnxaccel import target as target_module

    seen: list[str] = []
    real = target_module._parse_string

    def counted(text):
        seen.append(text)
        return real(text)

    monkeypatch.setattr(target_module, "_parse_string", counted)
    return seen


def test_serving_a_target_parses_no_text_between_the_flag_and_the_sessions(monkeypatch, mlp_path):
    from onnxaccel.serve.config import model_defaults
    from onnxaccel.serve.repository import ModelRepository
    from onnxaccel.target import parse_target

    target = parse_target("cpu?intra_op_num_threads=1")  # what the CLI's one parse gives
    seen = _counting(monkeypatch)

    async def load():
        repository = ModelRepository(str(mlp_path), model_defaults({"target": target, "max_batch": 4}))
        (entry,) = [await repository.load(name) for name in list(repository.entries)]
        if entry.instance is None:
            return entry.state, None, None, entry.reason
        instance, state = entry.instance, entry.state
        outputs, _ = instance.execute_joined(0, [{"x": np.ones((1, 4), np.float32)}])
        await repository.close()
        return state, instance.plan.target, outputs, ""

    state, planned, outputs, reason = asyncio.run(load())
    assert state == "READY", reason
    assert planned == target and outputs
    assert seen == []


def test_a_batch_job_given_a_target_parses_no_text(monkeypatch, mlp_path, tmp_path):
    from onnxaccel.scale import BatchJob, run_batch
    from onnxaccel.target import parse_target

    data = tmp_path / "npy"
    data.mkdir()
    np.save(data / "a.npy", np.ones((6, 4), np.float32))
    target = parse_target("cpu")
    seen = _counting(monkeypatch)
    report = run_batch(BatchJob(str(mlp_path), str(data), str(tmp_path / "out"), target=target, batch=4))
    assert report.rows_done == 6 and report.plan["target"] == "cpu"
    assert seen == []
