"""rocprofv3's own option parsing, rebuilt from the excerpts of its source vendored beside this file.

Each ``rocprofv3_*.txt`` starts with a line naming repository, path and commit, then quotes the parser's lines
verbatim in blocks headed ``# --- lines A-B``. ``parser_from_excerpt`` executes the blocks in order (dedented,
as they sit inside ``parse_arguments``), so a command line is accepted or refused by the release's own
``argparse`` declarations. Two module-level helpers of rocprofv3.py are not quoted because they do not change
how our command line parses: ``format_help`` only sets the help width, and ``strtobool`` receives ``True``
(the ``const`` of a flag given without a value) and returns it.

Run as a script (``python rocprofv3.py EXCERPT ARGS...``) it is a stand-in for the tool: it parses ARGS with
EXCERPT's parser (exiting 2 with argparse's message on a refused option, like the real tool), runs the
application after ``--``, and writes ``<-o>_kernel_stats.csv`` under ``<-d>/<host>/<pid>/`` with the columns
of rocprofv3's kernel statistics.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).parent
EXCERPTS = sorted(HERE.glob("rocprofv3_*.txt"))
STATS_CSV = ('"Name","Calls","TotalDurationNs","AverageNs","Percentage","MinNs","MaxNs","StdDev"\n'
             '"Cijk_Ailk_Bljk_SB_MT64x64x8","12","240000","20000.0","100.0","19000","21000","500.0"\n')


def source_of(excerpt: Path) -> str:
    """The excerpt's first line: repository, path and commit."""
    return excerpt.read_text().splitlines()[0].lstrip("# ")


def _blocks(excerpt: Path) -> list[str]:
    blocks: list[list[str]] = []
    for line in excerpt.read_text().splitlines()[1:]:
        if line.startswith("# --- lines "):
            blocks.append([])
        else:
            blocks[-1].append(line)
    return [textwrap.dedent("\n".join(block)) for block in blocks]


def _strtobool(value):
    return value if isinstance(value, bool) else str(value).lower() in ("y", "yes", "t", "true", "on", "1")


def parse(excerpt: Path, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(rocprofv3's options, the application's argv) as that release reads ``argv``; SystemExit(2) when the
    release refuses an option."""
    scope = {"argparse": argparse, "os": os, "sys": sys, "usage_examples": "", "args": list(argv),
             "format_help": lambda formatter: formatter, "strtobool": _strtobool}
    for block in _blocks(excerpt):
        exec(compile(block, str(excerpt), "exec"), scope)  # noqa: S102 - upstream's own declarations
    return scope["parser"].parse_args(scope["rocp_args"]), scope["app_args"]


def main(argv: list[str]) -> int:
    options, app = parse(Path(argv[0]), argv[1:])
    done = subprocess.run(app, check=False)
    if done.returncode != 0:
        return done.returncode
    if options.stats and "csv" in (options.output_format or ()):
        folder = Path(options.output_directory or ".") / socket.gethostname() / str(os.getpid())
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{options.output_file or 'results'}_kernel_stats.csv").write_text(STATS_CSV)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
