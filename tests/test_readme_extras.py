"""What the README's "Use" section runs, `make demo` installs: every command of its bash blocks (GPU blocks
included) needs only the extras the Makefile's DEMO_EXTRAS lists, besides the ONNX Runtime build. `batch` needs
pyarrow through its own light extra, not through `ray`; a Ray example stays out of the blocks (prose that names
the `ray` extra). The core dependencies include sympy, which `inspect`, `bench` and `optimize` need."""

from __future__ import annotations

import re

import pytest

from model_builders import ROOT
from test_readme_examples import BLOCK, use_section

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
MAKEFILE = (ROOT / "Makefile").read_text()

#: The extra a command needs, beyond the ONNX Runtime build (MissingDependencyError names it in the source).
COMMAND_EXTRAS = {"serve": {"serve"}, "batch": {"parquet"}}
#: The extra an option needs, whatever the command.
OPTION_EXTRAS = {"--ray": {"ray"}, "--simplify": {"optimize"}, "--draw": {"image"}, "--protocol grpc": {"serve"}}
#: Image files as inputs need Pillow.
IMAGE_INPUT = re.compile(r"=\S+\.(jpe?g|png|bmp|webp)\b|--input \S+/")
#: The package each extra brings that those commands import.
BRINGS = {"serve": "fastapi", "parquet": "pyarrow", "image": "pillow", "ray": "ray", "optimize": "onnxslim"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


def demo_extras() -> set[str]:
    """The extras `make demo` installs besides $(EXTRA): the Makefile's DEMO_EXTRAS."""
    match = re.search(r"^DEMO_EXTRAS\s*:=\s*(\S+)", MAKEFILE, re.M)
    assert match, "the Makefile defines DEMO_EXTRAS"
    return set(match.group(1).split(","))


def commands() -> list[str]:
    """Every `onnxaccel ...` command line of the Use section's bash blocks, continuation lines joined."""
    found = []
    for block in BLOCK.finditer(use_section()):
        text = block.group(2).replace("\\\n", " ")
        for line in text.splitlines():
            for part in re.split(r"&&|;", line.split("  #")[0]):
                match = re.search(r"(?:^|\s)onnxaccel\s+(.*)", part)
                if match:
                    found.append(match.group(1).strip())
    return found


def needs(command: str) -> set[str]:
    """The extras one command line needs."""
    extras = set(COMMAND_EXTRAS.get(command.split()[0], set()))
    for option, extra in OPTION_EXTRAS.items():
        if re.search(rf"(^|\s){re.escape(option)}(\s|=|$)", command):
            extras |= extra
    if IMAGE_INPUT.search(command):
        extras.add("image")
    return extras


def test_make_demo_installs_the_demo_extras():
    recipe = re.search(r"^\$\(VENV\)/\.installed-\$\(EXTRA\):.*\n\t(.*)", MAKEFILE, re.M)
    assert recipe and '-e ".[$(EXTRA),$(DEMO_EXTRAS)]"' in recipe.group(1)
    assert re.search(r"^demo: \$\(VENV\)/\.installed-\$\(EXTRA\)", MAKEFILE, re.M)


def test_the_use_section_needs_no_extra_make_demo_leaves_out():
    lines = commands()
    assert len(lines) > 20 and any(c.startswith("batch ") for c in lines) and any(c.startswith("serve ") for c in lines)
    missing = {c: needs(c) - demo_extras() for c in lines if needs(c) - demo_extras()}
    assert not missing, f"README 'Use' commands need extras `make demo` does not install: {missing}"


def test_the_extras_exist_and_bring_what_the_commands_import():
    extras = PROJECT["optional-dependencies"]
    for extra in demo_extras() | {e for c in commands() for e in needs(c)}:
        assert extra in extras, extra
        assert BRINGS[extra] in {_name(r) for r in extras[extra]}, (extra, extras[extra])


def test_batch_has_a_light_parquet_extra_without_ray():
    parquet = {_name(r) for r in PROJECT["optional-dependencies"]["parquet"]}
    assert parquet == {"pyarrow"}
    assert "parquet" in demo_extras() and "ray" not in demo_extras()


def test_the_ray_examples_name_the_ray_extra():
    section = use_section()
    assert "--ray" in section and "onnxaccel[ray]" in section


def test_sympy_is_a_core_dependency():
    """ONNX Runtime's symbolic shape inference imports sympy; onnxruntime itself stopped requiring it."""
    assert "sympy" in {_name(r) for r in PROJECT["dependencies"]}
