"""`import onnxaccel`, building the command line and every `--help` load no heavy library (docs/ARCHITECTURE.md,
"Layers": optional and heavy libraries are imported where they are used; issue 36: the command line starts
fast). Each check runs in a fresh interpreter, since this test process has imported everything already. What
a command needs is imported when it runs; `run` on a model still loads onnx, numpy and ONNX Runtime then.
No timings here: benchmarks/startup_cpu.py measures them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

#: Libraries that neither `import onnxaccel` nor the command line's --help may load.
HEAVY = ("onnx", "onnxruntime", "numpy", "ml_dtypes", "google.protobuf", "torch", "torchvision", "PIL", "fastapi",
         "uvicorn", "grpc", "ray", "pyarrow", "pandas", "amdsmi", "pynvml", "migraphx", "pydantic")


def _loaded(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it leaves a JSON-able value in ``out``. Returns that value and which
    of HEAVY ended up in sys.modules."""
    script = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        print(json.dumps({{"out": out, "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_onnxaccel_loads_no_heavy_library():
    found = _loaded("""
        import onnxaccel
        out = onnxaccel.__version__
    """)
    assert found["heavy"] == []
    assert found["out"]


def test_every_public_name_still_imports_from_the_package():
    found = _loaded("""
        import onnxaccel
        from onnxaccel import *  # noqa: F403
        from onnxaccel import Model, OnnxAccelError, Target, TensorSpec, load_model, parse_target
        from onnxaccel.model import Model as M
        try:
            onnxaccel.no_such_name
            missing = "no error"
        except AttributeError as exc:
            missing = str(exc)
        out = {"all": sorted(onnxaccel.__all__), "dir": set(onnxaccel.__all__) <= set(dir(onnxaccel)),
               "same": Model is M and parse_target("cpu").device == "cpu", "missing": missing,
               "got": sorted(n for n in onnxaccel.__all__ if getattr(onnxaccel, n, None) is not None)}
    """)
    out = found["out"]
    assert out["got"] == out["all"] and out["dir"] and out["same"]
    assert "no_such_name" in out["missing"]


def test_the_command_line_and_every_help_load_no_heavy_library():
    found = _loaded("""
        import typer.main
        from typer.testing import CliRunner

        from onnxaccel.cli.main import app

        def paths(command, path=()):
            yield path
            for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
                yield from paths(sub, path + (name,))

        runner = CliRunner()
        out = {}
        for path in paths(typer.main.get_command(app)):
            result = runner.invoke(app, [*path, "--help"])
            out[" ".join(path) or "(root)"] = [result.exit_code, "Usage" in result.output]
    """)
    assert len(found["out"]) > 15, found["out"]  # the commands and the subcommands of cache and zoo
    assert {k: v for k, v in found["out"].items() if v != [0, True]} == {}
    assert found["heavy"] == [], f"--help loaded {found['heavy']}: import them where the command runs"


def test_engines_and_the_runtime_log_level_load_no_heavy_library():
    found = _loaded("""
        from onnxaccel import engines
        from onnxaccel.engines.ort_log import runtime_log_level, set_runtime_log_level

        set_runtime_log_level("verbose")
        out = [sorted(engines.REGISTRY), runtime_log_level()]
    """)
    assert found["out"] == [["migraphx", "ort"], "verbose"]
    assert found["heavy"] == []


def test_installed_ml_dtypes_is_one_that_imports_fast():
    """onnx imports ml_dtypes, and 0.7.0's extension module is slow to import (most of `run`'s start-up on a
    small CPU model; docs/BENCHMARKS.md "Start-up"). pyproject pins it below 0.7; an environment
    with 0.7 installed (a fresh install without the pin) fails here. The figures are in docs/BENCHMARKS.md."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.version import Version

    requires = metadata.requires("onnxaccel") or []
    pins = [Requirement(r) for r in requires if Requirement(r).name.replace("_", "-") == "ml-dtypes"
            and not Requirement(r).marker]
    assert pins, f"onnxaccel's installed metadata pins no ml_dtypes: {requires}"
    installed = Version(metadata.version("ml_dtypes"))
    assert pins[0].specifier.contains(installed), f"ml_dtypes {installed} outside {pins[0].specifier}"
    assert not pins[0].specifier.contains(Version("0.7.0"))
