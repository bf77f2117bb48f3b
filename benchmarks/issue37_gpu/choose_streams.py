"""Which `serve --streams` mode the Must-show grid runs with, chosen from call 6's figures (call_streams.sh).

Reads call 6's result files in OUT_DIR (``http-<label>.json`` from serve_vs_triton.py, one per mode: default,
shared, serial) and the answer checks (``graph-check-<label>.json`` from serve_graph_check.py, where one ran).
A mode qualifies when its server ran it (no "--streams M dropped" in its plan lines) and, where its answers
were checked, they held. Each mode is judged by its worst cell: the lowest share of in-process (the same run's
IO-binding reference) over the rows at the highest concurrency, perf_analyzer's figures, over the cells that
the default measured too. A mode replaces the default only where its worst cell beats the default's by more
than ``--margin`` (run-to-run noise at c256 was 81-89 % for one configuration in lease I).

Writes the chosen serve options to ``--write`` (empty for the default), so that the next call on the same
machine (call7_http.sh) runs the grid with them without a person in between, and prints one line per mode and
the choice; ``--json`` keeps the same.

    python3 benchmarks/issue37_gpu/choose_streams.py $OUT --write /tmp/s/serve_args --json $OUT/streams-choice.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODES = {"default": "", "shared": "--streams shared", "serial": "--streams serial"}


def judge(out: Path, label: str, generator: str) -> dict:
    """One mode's figures, worst cell and whether it qualifies (with the reason where not); a file that is no
    result of its kind rules the mode out with the reason, it does not stop the choice."""
    try:
        return _judge(out, label, generator)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        return {"mode": label, "serve_args": MODES[label], "qualifies": False,
                "why": f"its files are no result ({type(exc).__name__}: {exc})"}


def _judge(out: Path, label: str, generator: str) -> dict:
    found = {"mode": label, "serve_args": MODES[label]}
    path = out / f"http-{label}.json"
    if not path.exists():
        return {**found, "qualifies": False, "why": f"no {path.name}"}
    result = json.loads(path.read_text())
    server = result.get("servers", {}).get("onnxaccel", {})
    cells = {name: cell for name, cell in server.get("cells", {}).items()
             if name.startswith(f"{generator}-") and isinstance(cell.get("infer_per_s"), (int, float))}
    reference = result.get("in_process", {}).get("rows_per_s")
    if not cells or not reference:
        return {**found, "qualifies": False, "why": "no figures"}
    top = max(int(name.rsplit("-c", 1)[1]) for name in cells)
    shares = {name: cells[name]["infer_per_s"] / reference for name in sorted(cells) if name.endswith(f"-c{top}")}
    found.update({"concurrency": top, "in_process": reference, "shares": shares, "worst": min(shares.values()),
                  "p99_ms": {name: cells[name].get("p99_us", 0) / 1e3 for name in shares}})
    said = " ".join((server.get("log_head", "") + " " + server.get("log_tail", "")).split())  # lines unwrapped
    if label != "default" and f"--streams {label} dropped" in said:
        return {**found, "qualifies": False, "why": f"the server dropped --streams {label}"}
    check = out / f"graph-check-{label}.json"
    if check.exists():
        try:
            answers = json.loads(check.read_text())
        except json.JSONDecodeError:
            return {**found, "qualifies": False, "why": f"{check.name} is no result (the check failed)"}
        if not isinstance(answers, dict) or not answers.get("ok"):
            return {**found, "qualifies": False, "why": f"answers did not hold ({check.name})"}
        found["answers_checked"] = answers.get("requests")
    return {**found, "qualifies": True, "why": ""}


def choose(judged: list[dict], margin: float) -> dict:
    """The mode the grid runs: the default unless another qualifying mode's worst cell, over the cells both
    measured, beats the default's by the margin (the best such mode)."""
    default = next((j for j in judged if j["mode"] == "default"), {"mode": "default", "serve_args": ""})
    base = default.get("shares", {})

    def lead(j: dict) -> float | None:  # worst cell against the default's worst, over the cells both have
        common = set(base) & set(j.get("shares", {}))
        if not common:
            return None
        return min(j["shares"][c] for c in common) - min(base[c] for c in common)

    better = [(lead(j), j) for j in judged if j["qualifies"] and j["mode"] != "default"]
    better = [(by, j) for by, j in better if by is not None and by > margin]
    best = max(better, key=lambda pair: pair[0])[1] if better else default
    return {"mode": best["mode"], "serve_args": best["serve_args"], "margin": margin}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the directory with call 6's http-<mode>.json files")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--generator", default="perf_analyzer")
    parser.add_argument("--margin", type=float, default=0.01, help="share of in-process (0.01: one point)")
    parser.add_argument("--write", type=Path, default=None, help="file for the chosen serve options")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    judged = [judge(args.out, label, args.generator) for label in args.modes.split(",")]
    for j in judged:
        cells = ", ".join(f"{name.split('-')[1]} {share:.1%}" for name, share in j.get("shares", {}).items())
        state = "qualifies" if j["qualifies"] else f"out: {j['why']}"
        print(f"{j['mode']:>8}: c{j.get('concurrency', '?')} {cells or '-'}; {state}")
    chosen = choose(judged, args.margin)
    print(f"chosen: {chosen['mode']} (serve args: '{chosen['serve_args']}')")
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(chosen["serve_args"])
    if args.json:
        args.json.write_text(json.dumps({"modes": judged, "chosen": chosen}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
