"""One short flag, one meaning, across every command, and the old spellings for one more release.

The scheme: ``-o`` is ``--output`` wherever a command writes a file named by an option (optimize, zoo get,
tune, batch); ``-i`` is ``--input``; ``-c`` is ``--concurrency``; ``-n`` is ``--nodes``; ``--ep-option``,
``--protocol``, ``--interval``, ``--count``, ``--calibration`` and ``--keep-going`` have no short flag.
``tests/cli/test_flags.py`` walks every command's options and fails when a short flag means two things.

Before this scheme ``-o`` meant ``--ep-option`` in run/bench/serve/..., ``-O`` was ``--output`` in tune and
batch, and ``loadtest --protocol`` was ``-i``. :data:`DEPRECATED` keeps those spellings working: before a command
parses its arguments, an old short flag the command no longer defines is rewritten to its long name, with a note on
stderr. A short flag the command does define keeps its new meaning (``tune -o`` is ``--output`` now).
Remove :data:`DEPRECATED` in the release after next.
"""

from __future__ import annotations

from typer.core import TyperGroup

#: command -> old short flag -> the long option it meant. Applied only when the command no longer has the
#: short flag itself.
DEPRECATED: dict[str, dict[str, str]] = {
    **{name: {"-o": "--ep-option"} for name in ("run", "inspect", "bench", "compare", "profile", "serve", "check")},
    "tune": {"-O": "--output"},
    "batch": {"-o": "--ep-option", "-O": "--output"},
    "loadtest": {"-i": "--protocol"},
    "monitor": {"-i": "--interval", "-n": "--count"},
    "optimize": {"-c": "--calibration"},
}
DEPRECATED["check"]["-k"] = "--keep-going"


def short_flags(command) -> set[str]:
    """Every short flag (``-x``) the click ``command`` defines."""
    return {o for p in command.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))
            if o.startswith("-") and not o.startswith("--")}


def rewrite(name: str, command, args: list[str]) -> tuple[list[str], list[str]]:
    """``args`` with the deprecated short flags of command ``name`` replaced by their long names, and one note
    per flag replaced. Stops at ``--`` (what follows is not an option)."""
    old = {flag: long for flag, long in DEPRECATED.get(name, {}).items() if flag not in short_flags(command)}
    if not old:
        return args, []
    out, notes = [], []
    for i, arg in enumerate(args):
        if arg == "--":
            out += args[i:]
            break
        flag, value = arg[:2], arg[2:]
        if flag in old and not arg.startswith("--"):
            out.append(f"{old[flag]}={value}" if value else old[flag])
            note = (f"'{name} {flag}' is deprecated and will be removed in the next release: use "
                    f"{old[flag]}" + (" (-o now means --output in every command)" if flag == "-o" else "") + ".")
            if note not in notes:
                notes.append(note)
        else:
            out.append(arg)
    return out, notes


class DeprecatedFlagsGroup(TyperGroup):
    """The root group: rewrites a subcommand's deprecated short flags (:data:`DEPRECATED`) before it parses."""

    def resolve_command(self, ctx, args):  # noqa: ANN001, ANN201 - click's signature
        """Resolve as usual, then rewrite the subcommand's arguments, noting each old flag on stderr."""
        name, command, rest = super().resolve_command(ctx, args)
        if command is None or name is None:
            return name, command, rest
        rest, notes = rewrite(name, command, rest)
        if notes:
            from onnxaccel.cli.common import note  # the console lives there; imported late: no cycle at import

            for text in notes:
                note(text)
        return name, command, rest
