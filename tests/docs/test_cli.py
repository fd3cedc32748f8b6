"""The table of the ``loom`` command in docs/runtime.md is the command: every subcommand and
option it lists exists with the default it gives, and none of theirs is left out, so a
flag added, renamed or given another default fails here until the guide says so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Final

import click
import pytest
from loom_runtime.cli import main

ROOT: Final = Path(__file__).resolve().parents[2]
_ROW: Final = re.compile(
    r"^\| `loom (?P<command>\w+)` \| `(?P<option>--[\w-]+)[^`]*` \| (?P<default>[^|]+) \|"
)


def documented() -> dict[tuple[str, str], str]:
    """(subcommand, option) -> the default the guide's table gives (``required`` for none)."""
    text = (ROOT / "docs" / "runtime.md").read_text("utf-8")
    section = text.split("## The `loom` command", 1)[1].split("\n## ", 1)[0]
    rows: dict[tuple[str, str], str] = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match:
            rows[(match["command"], match["option"])] = match["default"].strip().strip("`")
    return rows


def actual() -> dict[tuple[str, str], str]:
    """The same, read from the click command the ``loom`` script runs."""
    assert isinstance(main, click.Group)
    rows: dict[tuple[str, str], str] = {}
    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param, click.Option) and "--help" not in param.opts:
                long = next(o for o in param.opts if o.startswith("--"))
                rows[(name, long)] = "required" if param.required else str(param.default)
    return rows


def test_the_guide_lists_every_subcommand_and_option_with_its_default() -> None:
    rows = documented()
    assert rows, "docs/runtime.md has no table of the loom command"
    assert rows == actual()


@pytest.mark.parametrize("argv", [["--help"], ["worker", "--help"], ["demo", "--help"]])
def test_every_help_the_guide_points_to_prints_and_exits_0(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "loom_runtime", *argv],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage:")
