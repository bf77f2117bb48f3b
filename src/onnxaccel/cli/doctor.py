"""`onnxaccel doctor`: which targets really run here, and how to fix the ones that do not."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.markup import escape as e

from onnxaccel.cli.args_data import OutputArgs
from onnxaccel.cli.args_model import TargetArgs
from onnxaccel.cli.common import console, handle_errors, print_json
from onnxaccel.cli.compose import composed
from onnxaccel.cli.tables import columns, new_table
from onnxaccel.system.findings import ERROR, INFO, OK, WARN

if TYPE_CHECKING:
    from onnxaccel.engines.ort_flavour import OrtBuild
    from onnxaccel.system.doctor import DoctorReport

_MARK = {OK: "[green]ok[/]", INFO: "[blue]info[/]", WARN: "[yellow]warn[/]", ERROR: "[bold red]error[/]"}


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to the application."""
    app.command("doctor", help="Check this machine: ONNX Runtime packages and conflicts, which execution "
                "providers really load (a session is built on each), AMD and NVIDIA GPUs, ROCm/CUDA versions, "
                "environment variables. With --target T, exit 1 unless T is ready (for scripts and containers).")(
        doctor_command)


@handle_errors
@composed(TargetArgs(kind="text", precision=None, ep_option=None, help="Check only this target (cpu, cuda, migraphx, "
                     "rocm, tensorrt, with :ID or ?options); exit status 1 when it is not ready."), OutputArgs())
def doctor_command(target: str | None, as_json: bool) -> None:
    """Check the machine (or one target) and print the findings; exit 1 when the target is not ready."""
    from onnxaccel.engines.ort_flavour import installed_build  # the checks: imported when the command runs
    from onnxaccel.system.doctor import run_doctor

    report = run_doctor(target)
    build = installed_build()
    if as_json:
        print_json({**report.to_dict(), "ort_build": build.to_dict()})
    else:
        render(report, build)
    if not report.ok:
        raise typer.Exit(1)


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f} GiB"


def _render_build(build: OrtBuild) -> None:
    """The build's flavour and what it means for AMD's providers: option spelling, environment-only settings."""
    first, *rest = build.describe()
    console.print(f"[bold]Build[/]  {e(first)}", highlight=False)
    for line in rest:
        console.print(f"  {e(line)}", highlight=False)


def render(report: DoctorReport, build: OrtBuild | None = None) -> None:
    """Print the doctor report: system, ONNX Runtime build, providers, GPUs and findings."""
    system, runtime = report.system, report.runtime
    console.print(f"[bold]System[/]  {e(system['os'])}; Python {system['python']}; {e(system['cpu'])} "
                  f"({system['cpu_count']} CPUs)", highlight=False)
    dists = ", ".join(f"{k} {v}" for k, v in report.install.distributions.items()) or "none installed"
    built = ", ".join(runtime.get("providers", [])) or "-"
    console.print(f"[bold]ONNX Runtime[/]  {runtime.get('version', 'not importable')} ({e(dists)}); built with: {built}",
                  highlight=False)
    if build is not None:
        _render_build(build)

    table = columns(new_table("Targets (a session was built on each)"), ("target", "provider", "verdict", "why / fix"),
                    numbers=())
    for verdict in report.targets:
        why = "" if verdict.ready else f"{e(verdict.cause or '')}\n[cyan]fix:[/] {e(verdict.fix or '-')}"
        if verdict.warnings:
            why = (why + "\n" if why else "") + "\n".join(f"[yellow]![/] {e(w)}" for w in verdict.warnings)
        table.add_row(e(verdict.target), verdict.provider,
                      "[green]ready[/]" if verdict.ready else "[bold red]not ready[/]", why)
    console.print(table)

    gpus = columns(new_table("GPUs"), ("vendor", "#", "name", "arch", "memory", "free", "source"),
                   numbers=("#", "memory", "free"))
    for gpu in report.nvidia.gpus:
        gpus.add_row("NVIDIA", str(gpu.index), e(gpu.name), f"sm {gpu.compute_capability or '?'}",
                     _gib(gpu.memory_total_bytes), _gib(gpu.memory_free_bytes), report.nvidia.source)
    for gpu in report.amd.gpus:
        gpus.add_row("AMD", str(gpu.index), e(gpu.name), gpu.gfx or "?", _gib(gpu.vram_total_bytes),
                     _gib(gpu.vram_free_bytes), report.amd.source)
    if gpus.row_count:
        console.print(gpus)
    else:
        console.print("[bold]GPUs[/]  none found")

    if report.environment:
        env = columns(new_table("Environment"), ("variable", "value", "effect"), numbers=())
        for setting in report.environment:
            env.add_row(setting.name, e(setting.value), e(setting.effect))
        console.print(env)

    findings = columns(new_table("Findings"), ("", "finding", "fix"), numbers=())
    for finding in report.findings:
        text = e(finding.title) + (f"\n[dim]{e(finding.detail)}[/]" if finding.detail else "")
        findings.add_row(_MARK[finding.severity], text, e(finding.fix))
    console.print(findings)

    if report.requested:
        verdict = report.verdict(report.requested)
        if verdict and verdict.ready:
            console.print(f"[bold green]{verdict.target}: ready[/]")
        elif verdict:
            console.print(f"[bold red]{e(verdict.target)}: not ready[/] ({e(verdict.cause or '')})\n[cyan]fix:[/] "
                          f"{e(verdict.fix or '-')}",
                          highlight=False)
