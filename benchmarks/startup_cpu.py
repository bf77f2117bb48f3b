"""Start-up of the command line on the CPU against a plain ONNX Runtime script (issue 36; goal: <= 1.5x).

Whole-process wall time, each row a fresh Python process, run in rounds (A B C A B C ...) so that drift of the
machine hits all alike; each figure is the median over rounds:

* ``help``: ``onnxaccel --help``.
* ``run``: ``onnxaccel run MODEL -t cpu`` (synthesized inputs, one inference, the text report).
* ``typer floor``: the plain script's work as the one command of a bare Typer app (what any Typer command line
  pays before its command runs: typer, click, rich, pydantic).
* ``plain``: the reference a user writes by hand on the same model::

      import numpy as np, onnxruntime as ort
      s = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
      s.run(None, {i.name: np.zeros(shape, dtype) for i in s.get_inputs()})

The ratios are ``help / plain`` and ``run / plain``. CPU time (user + system) of each process is reported too
(``os.wait4``), and one ``run --json``'s start-up breakdown (its ``"startup"`` field), where the tree has one.

Bytecode: the processes run with a bytecode cache (``PYTHONPYCACHEPREFIX`` in a temporary folder, written by
an untimed first run), as an installed package has one; ``--as-is`` keeps this environment's setting instead
(with ``PYTHONDONTWRITEBYTECODE=1`` and an editable install, every onnxaccel module is compiled from source in
every process, which costs the command line more than the plain script).

The command line is started as ``python -c "from onnxaccel.cli.main import main; main()"`` (what the console
script does), with ``--src DIR`` put first on PYTHONPATH: ``--src /tmp/before/src`` measures another checkout
(a ``git worktree``) with the same interpreter and packages.

The model: ``--model PATH``, else the small MLP ``tests/model_builders.py`` builds (written with onnx.helper to a
temporary folder: no network), and also ``zoo:squeezenet`` where it is in the zoo cache already
(``~/.cache/onnxaccel/zoo/squeezenet-1.onnx``, or ONNXACCEL_CACHE_DIR's).

Usage:  python benchmarks/startup_cpu.py [--rounds 7] [--src DIR] [--model PATH] [--as-is] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

CLI = "import sys; from onnxaccel.cli.main import main; sys.argv[0] = 'onnxaccel'; main()"

PLAIN = """import sys
import numpy as np, onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
          "tensor(int32)": np.int32, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}
feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], dtypes[i.type])
         for i in s.get_inputs()}
out = s.run(None, feeds)
print([o.shape for o in out])
"""

# The floor of any Typer command line: the plain script's work behind a bare Typer app with one command and one
# argument (typer imports click, rich and pydantic before the command runs). `run` cannot start faster than this
# while its command line is Typer.
TYPER_PLAIN = """import sys, typer
app = typer.Typer()
@app.command()
def run(model: str, target: str = "cpu"):
    src = PLAIN_SRC
    exec(src, {"__name__": "plain"})
@app.callback()
def main_():
    pass
sys.argv = ["plain", "run"] + sys.argv[1:]
app()
"""


def small_mlp(path: Path) -> Path:
    """The test suite's MLP (x[batch, 4] -> MatMul -> Relu -> MatMul -> Softmax): tests/model_builders.py."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from model_builders import make_mlp

    return make_mlp(path)


def cached_squeezenet() -> Path | None:
    """The zoo's squeezenet file, where an earlier ``zoo get`` or ``run zoo:squeezenet`` left it."""
    root = Path(os.environ.get("ONNXACCEL_CACHE_DIR") or Path.home() / ".cache" / "onnxaccel")
    path = root / "zoo" / "squeezenet-1.onnx"
    return path if path.is_file() else None


def timed(argv: list[str], env: dict, cwd: str) -> tuple[float, float, str]:
    """(wall s, CPU s = user + system, stdout) of one fresh process; raises when it fails. The CPU time is the
    difference of this process's RUSAGE_CHILDREN around it (one child at a time)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[2:]} failed (rc={proc.returncode}):\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def measure(model: str, rounds: int, env: dict, cwd: str) -> dict:
    """Rounds of help / run / plain on ``model``; medians and ratios."""
    py = sys.executable
    cases = {"help": [py, "-c", CLI, "--help"],
             "run": [py, "-c", CLI, "run", model, "-t", "cpu"],
             "plain": [py, "-c", PLAIN, model],
             "typer floor": [py, "-c", TYPER_PLAIN.replace("PLAIN_SRC", repr(PLAIN.replace("sys.argv[1]",
                                                                                         repr(model)))), model],
             "import onnx": [py, "-c", "import onnx"]}  # what reading the model with onnx costs before any work
    for argv in cases.values():  # warm the page cache and the zoo lookup once, untimed
        timed(argv, env, cwd)
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, argv in cases.items():
            wall, cpu, _ = timed(argv, env, cwd)
            rows[name].append((wall, cpu))
    med = {k: {"wall_s": statistics.median(w for w, _ in v), "cpu_s": statistics.median(c for _, c in v),
               "wall_all_s": [round(w, 4) for w, _ in v]} for k, v in rows.items()}
    plain = med["plain"]["wall_s"]
    breakdown = None
    _, _, out = timed(cases["run"] + ["--json"], env, cwd)
    try:
        breakdown = json.loads(out).get("startup")
    except (json.JSONDecodeError, AttributeError):
        pass
    return {"model": model, "medians": med,
            "ratio_help": med["help"]["wall_s"] / plain, "ratio_run": med["run"]["wall_s"] / plain,
            "ratio_typer_floor": med["typer floor"]["wall_s"] / plain,
            "run_startup": breakdown}


def versions() -> dict[str, str | None]:
    """Versions of the packages start-up depends on (ml_dtypes: onnx imports it, and its import cost varies
    by release)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in ("onnx", "ml_dtypes", "numpy", "onnxruntime", "typer", "rich", "protobuf"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(src: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--src", type=Path, default=None, help="put this folder first on PYTHONPATH")
    parser.add_argument("--model", action="append", default=None, help="an .onnx file (repeatable)")
    parser.add_argument("--as-is", action="store_true", help="keep this environment's bytecode setting")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = os.pathsep.join([str(args.src.resolve()), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    src = args.src or Path(__file__).resolve().parents[1] / "src"
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.as_is:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        models = args.model or [str(small_mlp(Path(tmp) / "mlp.onnx"))]
        if args.model is None and (squeeze := cached_squeezenet()):
            models.append(str(squeeze))
        for model in models:
            r = measure(model, args.rounds, env, cwd=tmp)
            results.append(r)
            m = r["medians"]
            print(f"{Path(model).name}: median wall of {args.rounds} fresh processes "
                  f"(CPU s in parentheses)")
            for name in ("help", "run", "plain", "typer floor", "import onnx"):
                print(f"  {name:<12}{m[name]['wall_s']:7.3f} s  ({m[name]['cpu_s']:.3f} s CPU)")
            print(f"  --help / plain {r['ratio_help']:.2f}x, run / plain {r['ratio_run']:.2f}x (goal <= 1.5x); "
                  f"typer floor / plain {r['ratio_typer_floor']:.2f}x")
            if r["run_startup"]:
                stages = ", ".join(f"{s['stage']} {s['seconds']:.3f} s" for s in r["run_startup"]["stages"])
                print(f"  run --json start-up: {stages}")
    out = {"benchmark": "startup_cpu", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "commit": git_commit(src), "src": str(src), "python": platform.python_version(),
           "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "rounds": args.rounds,
           "bytecode_cache": not args.as_is, "versions": versions(),
           "results": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
