"""ONNX conformance of onnxaccel against plain ONNX Runtime, over ONNX's own backend test suites.

Suites: the node cases written from onnx's generators (``node``, ~1900 cases, written once into the cache)
and the data shipped in the onnx wheel (simple, pytorch-converted, pytorch-operator, real, light). For every
case:

  (a) plain ONNX Runtime: an InferenceSession fed the .pb values (onnx.numpy_helper), outputs compared with
      the same comparator `check` uses (ONNX's tolerances) -- the reference;
  (b) `onnxaccel check` on the target (library API: discover + run_check);
  (c) with --fp16: the model converted as `optimize --fp16` converts it (precision.fp16.convert_fp16, FP32
      inputs/outputs kept), validated by onnx.checker.check_model(full_check=True) and rerun through `check`
      within FP16 tolerances (compare.tolerance FP16_RTOL/FP16_ATOL);
  (d) with --optimize-cli: the command itself, `onnxaccel optimize MODEL -o OUT --fp16 -t TARGET`, per case
      (every Nth with --optimize-every N); each OUT it writes is validated by onnx.checker.check_model(OUT,
      full_check=True), reloaded with `onnxaccel run OUT -t TARGET`, and checked against the case's expected
      outputs within FP16 tolerances.

  python benchmarks/conformance.py --out benchmarks/results/conformance_cpu
  python benchmarks/conformance.py --target cuda --out benchmarks/results/conformance_cuda
  python benchmarks/conformance.py --target cuda --precision fp16 --no-fp16 --out .../conformance_cuda_fp16
  python benchmarks/conformance.py --suite light --optimize-cli --out benchmarks/results/optimize_fp16_cli_light
  python benchmarks/conformance.py --suite node --case test_clip --case test_if --optimize-cli --no-fp16 --out ...

Writes OUT.json and OUT.md (counts per suite; the cases plain ORT passes and onnxaccel does not, with the
reason; the FP16 results).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

SCHEMA = "onnxaccel.conformance-run/1"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from onnxaccel.conformance import TolerancePolicy, discover, run_check
    from onnxaccel.conformance.onnx_suites import SUITES, suite_dir
    from onnxaccel.target import parse_target

    target = parse_target(args.target, precision=args.precision)
    suites = args.suite or list(SUITES)
    unknown = sorted(set(suites) - set(SUITES))
    if unknown:
        print(f"unknown suite(s): {', '.join(unknown)}; choose from {', '.join(SUITES)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from onnxaccel.paths import cache_root

    fp16_dir = cache_root() / "conformance" / "fp16-models"  # converted models: cache, not results
    report: dict = {"schema": SCHEMA, "command": " ".join(sys.argv), "target": str(target),
                    "environment": _environment(), "suites": {}}
    for suite in suites:
        started = time.perf_counter()
        cases = discover([suite_dir(suite)])
        if args.case:
            cases = [c for c in cases if c.name.split("/", 1)[-1] in args.case]
        if args.limit:
            cases = cases[: args.limit]
        _progress(f"{suite}: {len(cases)} cases")
        t0 = time.perf_counter()
        reference = {c.name: ort_reference(c, target) for c in cases}
        ort_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        checked = run_check(cases, target, policy=TolerancePolicy(precision=target.precision))
        check_seconds = time.perf_counter() - t0
        by_name = {r.name: r for r in checked.cases}
        regressions = [{"case": c.name, "status": by_name[c.name].status, "reason": _reason(by_name[c.name])}
                       for c in cases if reference[c.name]["status"] == "pass"
                       and by_name[c.name].status != "pass"]
        entry = {
            "cases": len(cases), "ort": _counts(r["status"] for r in reference.values()),
            "check": checked.counts(), "ort_pass_check_not": regressions,
            "check_pass_ort_not": [c.name for c in cases if by_name[c.name].status == "pass"
                                   and reference[c.name]["status"] != "pass"],
            "providers": checked.providers, "ort_seconds": round(ort_seconds, 2),
            "check_seconds": round(check_seconds, 2),
            "ort_results": reference,
            "check_results": {r.name: {"status": r.status, "detail": r.detail()} for r in checked.cases},
        }
        if args.fp16:
            t0 = time.perf_counter()
            entry["fp16"] = fp16_run(cases, target, fp16_dir, TolerancePolicy(precision="fp16"))
            entry["fp16"]["seconds"] = round(time.perf_counter() - t0, 2)
            entry["fp16"]["of_ort_pass"] = _fp16_of_ort_pass(entry["fp16"], reference)
        if args.optimize_cli:
            if args.optimize_every < 1:
                raise SystemExit("--optimize-every must be 1 or more")
            t0 = time.perf_counter()
            picked = cases[:: args.optimize_every]
            entry["optimize_cli"] = optimize_cli_run(picked, target, cache_root() / "conformance" / "optimize-cli",
                                                     TolerancePolicy(precision="fp16"), reference)
            entry["optimize_cli"]["every"] = args.optimize_every
            entry["optimize_cli"]["seconds"] = round(time.perf_counter() - t0, 2)
            _progress(f"{suite}: optimize --fp16 " + json.dumps({k: v for k, v in entry["optimize_cli"].items()
                                                                  if not isinstance(v, list)}))
        entry["seconds"] = round(time.perf_counter() - started, 2)
        report["suites"][suite] = entry
        _progress(f"{suite}: ORT {entry['ort']}, check {entry['check']}, {len(regressions)} regression(s), "
                  f"{entry['seconds']:.0f} s")
    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    json_path.write_text(json.dumps(report, indent=2, default=str))
    md_path.write_text(markdown(report))
    print(md_path.read_text())
    return 0


# --- (a) plain ONNX Runtime -----------------------------------------------------------------------------

def ort_reference(case, target) -> dict:
    """Run the case in a bare InferenceSession and compare with the conformance comparator."""
    import onnxruntime as ort

    from onnxaccel.compare.tolerance import TolerancePolicy, compare_value

    if case.skip or case.model is None:
        return {"status": "skipped", "reason": case.skip}
    try:
        import onnx

        model = onnx.load(str(case.model))
        providers = [target.provider, "CPUExecutionProvider"] if target.engine == "ort" else ["CPUExecutionProvider"]
        so = ort.SessionOptions()
        so.log_severity_level = 3  # errors surface as exceptions; keep the runtime's warnings out of the run
        session = ort.InferenceSession(str(case.model), so, providers=list(dict.fromkeys(providers)))
        policy = TolerancePolicy().for_case(case.rtol, case.atol)
        passed = True
        worst = None
        for data_set in case.data_sets:
            feeds = _reference_feeds(model, case, data_set)
            names = [o.name for o in model.graph.output]
            actual = dict(zip(names, session.run(names, feeds)))
            for k, path in enumerate(data_set.outputs):
                spec = model.graph.output[k]
                for check in compare_value(spec.name, _load_value(path, spec.type), actual[spec.name], policy):
                    if not check.passed:
                        passed = False
                        worst = worst or check.summary()
        return {"status": "pass" if passed else "fail", "reason": worst}
    except Exception as exc:  # noqa: BLE001 - the reference's own failure is a result
        return {"status": "error", "reason": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"}


def _reference_feeds(model, case, data_set) -> dict:
    if case.generated_inputs == "arange":
        from onnxaccel.conformance.runner import _arange_inputs

        return _arange_inputs(model)
    return {model.graph.input[k].name: _load_value(path, model.graph.input[k].type)
            for k, path in enumerate(data_set.inputs)}


def _load_value(path: Path, type_proto):
    """As onnx's runner loads a .pb (runner/__init__.py ``_load_proto``): by the graph's type, numpy_helper."""
    import onnx
    from onnx import numpy_helper

    data = Path(path).read_bytes()
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        proto = onnx.SequenceProto()
        proto.ParseFromString(data)
        return numpy_helper.to_list(proto)
    if kind == "optional_type":
        proto = onnx.OptionalProto()
        proto.ParseFromString(data)
        return numpy_helper.to_optional(proto)
    if kind == "map_type":
        proto = onnx.MapProto()
        proto.ParseFromString(data)
        return numpy_helper.to_dict(proto)
    proto = onnx.TensorProto()
    proto.ParseFromString(data)
    return numpy_helper.to_array(proto)


# --- (c) optimize --fp16 ---------------------------------------------------------------------------------

def fp16_run(cases, target, folder: Path, policy) -> dict:
    """Convert each loadable case as `optimize --fp16` does, check it with onnx.checker (full_check) and rerun
    it through `check` at FP32 (the model itself is FP16) within FP16 tolerances."""
    import onnx

    from onnxaccel.conformance import run_check
    from onnxaccel.precision.fp16 import convert_fp16

    fp32_target = dataclasses.replace(target, precision="fp32")
    # As `optimize --fp16 -t TARGET` converts: ops without a float16 kernel in the target's provider stay FP32.
    provider = target.provider if target.engine == "ort" else None
    converted, failures, noops = [], [], []
    for case in cases:
        if case.skip or case.model is None:
            continue
        try:
            proto = onnx.load(str(case.model))
        except Exception:  # noqa: BLE001 - not loadable: not counted
            continue
        path = folder / case.name / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fp16 = convert_fp16(proto, keep_io_types=True, provider=provider)
        except Exception as exc:  # noqa: BLE001 - the conversion's verdict is the result
            text = str(getattr(exc, "message", exc)).strip().splitlines()[0][:300]
            (noops if "changed no node" in text else failures).append(
                {"case": case.name, "stage": "convert", "reason": f"{type(exc).__name__}: {text}"})
            continue
        try:
            onnx.checker.check_model(fp16, full_check=True)
        except Exception as exc:  # noqa: BLE001 - the checker's verdict is the result
            failures.append({"case": case.name, "stage": "checker",
                             "reason": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"})
            continue
        onnx.save(fp16, str(path))
        converted.append(dataclasses.replace(case, model=path))
    checked = run_check(converted, fp32_target, policy=policy)
    return {"loadable": len(converted) + len(failures) + len(noops), "nothing_to_convert": len(noops),
            "converted": len(converted) + len(failures), "checker_pass": len(converted),
            "checker_failures": failures, "noops": noops, "check": checked.counts(),
            "not_passing": [{"case": r.name, "status": r.status, "reason": _reason(r)}
                            for r in checked.cases if r.status != "pass"]}


def optimize_cli_run(cases, target, folder: Path, policy, reference) -> dict:
    """`onnxaccel optimize MODEL -o OUT --fp16 -t TARGET` per case, as a user runs it (a subprocess); every OUT
    written is checked with onnx.checker (full_check), reloaded by `onnxaccel run OUT -t TARGET` and compared
    with the case's expected outputs (`check`, FP16 tolerances)."""
    import shutil
    import subprocess

    import onnx

    from onnxaccel.conformance import run_check

    fp32_target = dataclasses.replace(target, precision="fp32")
    cli = [sys.executable, "-m", "onnxaccel.cli.main"]
    rows = []
    for case in cases:
        if case.skip or case.model is None:
            continue
        out = folder / case.name / "model.onnx"
        shutil.rmtree(out.parent, ignore_errors=True)
        out.parent.mkdir(parents=True)
        proc = subprocess.run(cli + ["optimize", str(case.model), "-o", str(out), "--fp16", "-t", str(target)],
                              capture_output=True, text=True)
        row = {"case": case.name, "ort": reference[case.name]["status"], "optimize_rc": proc.returncode,
               "written": out.exists()}
        if proc.returncode != 0:
            row["optimize_error"] = _last_error(proc.stdout + proc.stderr)
        if out.exists():
            try:
                onnx.checker.check_model(str(out), full_check=True)
                row["checker"] = "pass"
            except Exception as exc:  # noqa: BLE001 - the checker's verdict is the result
                row["checker"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
            ran = subprocess.run(cli + ["run", str(out), "-t", str(target)], capture_output=True, text=True)
            row["run_rc"] = ran.returncode
            if ran.returncode != 0:
                row["run_error"] = _last_error(ran.stdout + ran.stderr)
            result = run_check([dataclasses.replace(case, model=out)], fp32_target, policy=policy).cases[0]
            row["check"] = result.status
            if result.status != "pass":
                row["check_reason"] = _reason(result)[:300]
        rows.append(row)
    written = [r for r in rows if r["written"]]
    return {"cases": len(rows), "accepted": sum(r["optimize_rc"] == 0 for r in rows),
            "refused": sum(not r["written"] for r in rows),
            "written_gate_failed": sum(r["written"] and r["optimize_rc"] != 0 for r in rows),
            "checker_pass": sum(r.get("checker") == "pass" for r in written),
            "run_pass": sum(r.get("run_rc") == 0 for r in written),
            "check_pass": sum(r.get("check") == "pass" for r in written), "rows": rows}


def _last_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith("error:"):
            return " ".join(lines[i:i + 3])[:400]
    return " ".join(lines[-3:])[:400]


def _fp16_of_ort_pass(fp16: dict, reference: dict) -> dict:
    """The FP16 figures over the cases plain ONNX Runtime passes in FP32: the others (opset-28 kernels, float8
    Casts, training ops...) fail at FP32 too, so their FP16 failure says nothing about the conversion."""
    passed = {name for name, r in reference.items() if r["status"] == "pass"}
    failures = [f for f in fp16["checker_failures"] + fp16["not_passing"] if f["case"] in passed]
    noops = sum(n["case"] in passed for n in fp16["noops"])
    converted = sum(1 for name in passed) - noops  # every ORT-passing case is loadable
    return {"cases": len(passed), "nothing_to_convert": noops, "converted": converted,
            "pass": converted - len(failures), "failures": failures}


# --- report ------------------------------------------------------------------------------------------------

def markdown(report: dict) -> str:
    lines = [f"# ONNX conformance: onnxaccel check vs plain ONNX Runtime ({report['target']})", "",
             f"`{report['command']}`", "",
             "| suite | cases | ORT pass | check pass | fail | error | skipped | ORT pass, check not | "
             "FP16 converted, checker ok | FP16 check pass | time (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    total = {"cases": 0, "ort": 0, "pass": 0, "fail": 0, "error": 0, "skipped": 0, "reg": 0, "fck": 0, "fpass": 0,
             "floadable": 0}
    for suite, e in report["suites"].items():
        fp16 = e.get("fp16")
        f_ok = f"{fp16['checker_pass']}/{fp16['converted']}" if fp16 else "-"
        f_pass = f"{fp16['check']['pass']}/{fp16['checker_pass']}" if fp16 else "-"
        lines.append(f"| {suite} | {e['cases']} | {e['ort']['pass']} | {e['check']['pass']} | {e['check']['fail']} "
                     f"| {e['check']['error']} | {e['check']['skipped']} | {len(e['ort_pass_check_not'])} | {f_ok} "
                     f"| {f_pass} | {e['seconds']:.0f} |")
        for key, value in (("cases", e["cases"]), ("ort", e["ort"]["pass"]), ("reg", len(e["ort_pass_check_not"]))):
            total[key] += value
        for key in ("pass", "fail", "error", "skipped"):
            total[key] += e["check"][key]
        if fp16:
            total["fck"] += fp16["checker_pass"]
            total["fpass"] += fp16["check"]["pass"]
            total["floadable"] += fp16["converted"]
    lines.append(f"| **all** | {total['cases']} | {total['ort']} | {total['pass']} | {total['fail']} | "
                 f"{total['error']} | {total['skipped']} | {total['reg']} | {total['fck']}/{total['floadable']} | "
                 f"{total['fpass']}/{total['fck']} | |")
    lines += ["", "FP16: models where `optimize --fp16` has nothing to convert (no float computation, or only "
              "ops that must stay FP32) are refused by it as a no-op and not counted in the FP16 columns: "
              + ", ".join(f"{s} {e['fp16']['nothing_to_convert']}" for s, e in report["suites"].items()
                          if e.get("fp16")) + ".",
              ""]
    ort_pass = [(s, e["fp16"]["of_ort_pass"]) for s, e in report["suites"].items()
                if e.get("fp16", {}).get("of_ort_pass")]
    if ort_pass:
        total_conv = sum(x["converted"] for _, x in ort_pass)
        total_ok = sum(x["pass"] for _, x in ort_pass)
        lines += [f"FP16 over the cases plain ONNX Runtime passes in FP32: {total_ok}/{total_conv} converted models "
                  "are valid and pass `check` within FP16 tolerance ("
                  + ", ".join(f"{s} {x['pass']}/{x['converted']}" for s, x in ort_pass) + "). The other FP16 "
                  "failures below are of cases plain ONNX Runtime fails in FP32 as well.", ""]
        failures = [(s, f) for s, x in ort_pass for f in x["failures"]]
        if failures:
            lines += ["Of those, not passing:", ""]
            lines += [f"- `{f['case']}` ({f.get('status', f.get('stage'))}): {f['reason']}" for _, f in failures]
            lines.append("")
    lines += ["## Cases plain ONNX Runtime passes and onnxaccel check does not", ""]
    regressions = [(s, r) for s, e in report["suites"].items() for r in e["ort_pass_check_not"]]
    lines += [f"- `{s}/{r['case'].split('/', 1)[-1]}` ({r['status']}): {r['reason']}"
              for s, r in regressions] or ["none"]
    cli = [(s, e["optimize_cli"]) for s, e in report["suites"].items() if e.get("optimize_cli")]
    if cli:
        lines += ["", "## `onnxaccel optimize MODEL -o OUT --fp16` (the command), OUT checked and reloaded", "",
                  "| suite | cases run | accepted (exit 0) | refused (no OUT) | OUT written, accuracy gate failed | "
                  "OUT passes check_model(full_check) | `run OUT` exit 0 | OUT passes `check` (FP16 tol.) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for s, c in cli:
            every = f" (every {c['every']}th)" if c["every"] > 1 else ""
            written = c["cases"] - c["refused"]
            lines.append(f"| {s} | {c['cases']}{every} | {c['accepted']} | {c['refused']} | {c['written_gate_failed']} "
                         f"| {c['checker_pass']}/{written} | {c['run_pass']}/{written} | {c['check_pass']}/{written} |")
        lines += ["", "Written models not passing the checker, `run` or `check`; then the refusals:", ""]
        if all(r["written"] and r["checker"] == "pass" and r["run_rc"] == 0 and r["check"] == "pass"
               for _, c in cli for r in c["rows"]):
            lines.append("none")
        for s, c in cli:
            for r in c["rows"]:
                if r["written"] and (r["checker"] != "pass" or r["run_rc"] != 0 or r["check"] != "pass"):
                    lines.append(f"- `{r['case']}` (plain ORT {r['ort']}; optimize exit {r['optimize_rc']}): checker "
                                 f"{r['checker']}; run exit {r['run_rc']} {r.get('run_error', '')}; check {r['check']} "
                                 f"{r.get('check_reason', '')}")
            for r in c["rows"]:
                if not r["written"]:
                    lines.append(f"- `{r['case']}` (plain ORT {r['ort']}) refused: {r.get('optimize_error', '')}")
    for suite, e in report["suites"].items():
        fp16 = e.get("fp16")
        if not fp16 or not (fp16["checker_failures"] or fp16["not_passing"]):
            continue
        lines += ["", f"## FP16 ({suite}): not valid or not within FP16 tolerance", ""]
        lines += [f"- `{f['case']}` ({f['stage']}): {f['reason']}" for f in fp16["checker_failures"]]
        lines += [f"- `{f['case']}` ({f['status']}): {f['reason']}" for f in fp16["not_passing"]]
    return "\n".join(lines) + "\n"


def _reason(result) -> str:
    text = result.detail()
    return text if not result.hint or result.status != "error" else f"{text} (hint: {result.hint})"


def _counts(statuses) -> dict:
    counts = {"pass": 0, "fail": 0, "error": 0, "skipped": 0}
    for status in statuses:
        counts[status] += 1
    return counts


def _environment() -> dict:
    import numpy
    import onnx
    import onnxruntime

    import onnxaccel

    return {"onnxaccel": onnxaccel.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "numpy": numpy.__version__, "python": sys.version.split()[0]}


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="Output path without suffix: OUT.json and OUT.md are written.")
    parser.add_argument("--suite", action="append", help="node, simple, pytorch-converted, pytorch-operator, real, "
                        "light (repeatable; default: all).")
    parser.add_argument("--target", "-t", default="cpu", help="Target string, e.g. cpu, cuda, migraphx.")
    parser.add_argument("--precision", "-p", default=None, help="fp32 (default) or fp16.")
    parser.add_argument("--limit", type=int, default=0, help="At most N cases per suite (0: all).")
    parser.add_argument("--case", action="append", help="Only this case (its folder name, e.g. test_clip; "
                        "repeatable).")
    parser.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=True,
                        help="Also convert each case to FP16 and check it (default: on).")
    parser.add_argument("--optimize-cli", action="store_true", help="Also run `onnxaccel optimize MODEL --fp16` per "
                        "case (a subprocess) and check, reload (`run`) and `check` what it writes.")
    parser.add_argument("--optimize-every", type=int, default=1, help="With --optimize-cli: every Nth case only.")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
